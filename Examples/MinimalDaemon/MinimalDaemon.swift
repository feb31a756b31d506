import Foundation
import HopEngine
import Logging
import ServiceLifecycle

// The start-up flow, written in one place; steps only report that they finished.
let startup = Flow("startup", version: "1") { flow in
    if try await flow.hop(to: "splash", timeout: .seconds(10)).timedOut {
        try await flow.sleep(for: .seconds(30), name: "splash-backoff")  // a durable timer
    }
    if try await flow.isFirstUse("onboarding") {
        try await flow.hop(to: "onboarding")
        try await flow.markUsed("onboarding")
    }
    while true {
        if try await flow.session() == nil {
            try await flow.hop(to: "login")
        }
        // `main` lasts while a session is stored: `hopctl session logout` re-routes it here.
        if try await !flow.hop(to: "main").rerouted { break }
    }
}

/// The daemon's own service: starts the flow (or resumes its unfinished run), then serves
/// until the group shuts down.
struct MyDaemon: Service {
    let engine: HopEngine
    let logger: Logger

    func run() async throws {
        let run = try await engine.start("startup", subject: "default")
        logger.info("start-up flow", metadata: ["run": "\(run.id)", "step": "\(run.currentStep ?? "-")"])
        try await gracefulShutdown()
    }
}

@main
enum MinimalDaemon {
    static func main() async throws {
        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        let logger = Logger(label: "my-daemon")
        let store = try await HopStore.open(logger: logger)  // $HOP_DB, else the default location
        let engine = HopEngine(
            store: store, logger: logger,
            configuration: .init(engineID: "my-daemon@\(ProcessInfo.processInfo.hostName)"))
        engine.register(startup)
        engine.register(step: "splash") { _ in try await Task.sleep(for: .milliseconds(200)) }
        engine.register(step: "onboarding", .external)  // hopctl unhop
        engine.register(step: "login", .external(unhopWhen: .sessionStored))  // hopctl session login
        engine.register(step: "main", .external(unhopWhen: .sessionRemoved))  // hopctl session logout

        let group = ServiceGroup(
            configuration: .init(
                services: [.init(service: engine), .init(service: MyDaemon(engine: engine, logger: logger))],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger))
        try await group.run()  // SIGTERM: in-flight steps are cancelled, runs stay resumable
    }
}
