import Hummingbird
import Logging
import Metrics
import Prometheus
import ServiceLifecycle

/// The daemon's metrics over HTTP: swift-metrics goes to a Prometheus registry, and an HTTP
/// server on loopback serves it in Prometheus' text format at `/metrics`, for a scraper or
/// `curl http://127.0.0.1:<port>/metrics`.
enum MetricsEndpoint {
    /// The content type of Prometheus' text exposition format.
    static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    /// Bootstraps the process's `MetricsSystem` with a Prometheus registry, once, and returns
    /// the service that serves it on `127.0.0.1:port` (any free port when `port` is 0); it
    /// calls `listening` with the port once the server accepts connections.
    static func bootstrap(
        port: Int, logger: Logger, listening: @escaping @Sendable (Int) -> Void
    ) -> some Service {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        let router = Router()
        router.get("metrics") { _, _ in
            Response(
                status: .ok, headers: [.contentType: contentType],
                body: ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
        }
        let server = Application(
            router: router,
            configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: port), serverName: nil),
            onServerRunning: { channel in listening(channel.localAddress?.port ?? port) },
            logger: logger)
        return Server(server: server, port: port)
    }

    /// The HTTP server, whose failure (a port in use) says which option to change.
    struct Server<Wrapped: Service>: Service {
        let server: Wrapped
        let port: Int

        func run() async throws {
            do {
                try await server.run()
            } catch {
                throw Failure(port: port, reason: "\(error)")
            }
        }
    }

    struct Failure: Error, CustomStringConvertible {
        let port: Int
        let reason: String
        var description: String {
            "cannot serve metrics on 127.0.0.1:\(port): \(reason). Pick another --metrics-port, or 0 for any free port."
        }
    }
}

/// `service`, run once `listening` yields (the metrics server listens). A group that stops
/// before (the port is in use, or the daemon is told to stop) never runs it.
struct AfterListening<Wrapped: Service>: Service {
    let service: Wrapped
    let listening: AsyncStream<Void>

    func run() async throws {
        let listens = await cancelWhenGracefulShutdown { await listening.first { true } != nil }
        guard listens == true, !Task.isCancelled else { return }
        try await service.run()
    }
}
