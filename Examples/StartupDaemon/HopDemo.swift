import ArgumentParser
import Foundation
import HopEngine
import HopPostgres
import Logging
import ServiceLifecycle
import Synchronization

/// A Linux daemon's start-up, made durable with Hop: splash, onboarding on first use,
/// login when no session is stored, then main.
@main
struct HopDemo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hop-demo",
        abstract:
            "Run the start-up flow of a daemon with Hop: splash, onboarding on first use, login without a stored session, main.",
        version: "hop-demo \(HopVersion.current)")

    @Flag(help: "Finish onboarding and login automatically after a short pause.")
    var auto = false

    @Option(
        help: ArgumentHelp(
            "The Hop database: a file, or a postgres:// URL (default: $HOP_DB, else the state folder).",
            valueName: "path-or-url"))
    var db: String?

    @Option(help: ArgumentHelp("Whom the flow runs for.", valueName: "subject"))
    var subject = "default"

    @Flag(help: "Log what the engine does (info level) to standard error.")
    var verbose = false

    @Option(
        help: ArgumentHelp(
            "The newest start-up flow this build has: 1, or 2 (a terms step after onboarding). "
                + "Version 1 stays registered, so runs that started on it finish on it.",
            valueName: "version"))
    var flowVersion = "1"

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Serve the engine's metrics in Prometheus' text format at http://127.0.0.1:<port>/metrics "
                + "(loopback only; 0: any free port, printed at start).",
            valueName: "port"))
    var metricsPort: Int?

    func validate() throws {
        // Refused before the database is opened (or created): bad input changes nothing.
        do {
            try Identifier.validate(subject, as: "subject")
        } catch let error as HopError {
            throw ValidationError("--subject: \(error.reason). \(error.hint ?? "")")
        }
        guard ["1", "2"].contains(flowVersion) else {
            throw ValidationError("--flow-version is 1 or 2 (2: a terms step follows onboarding)")
        }
        if let metricsPort, !(0...65535).contains(metricsPort) {
            throw ValidationError("--metrics-port is a TCP port, 1 to 65535 (0: any free port)")
        }
    }

    func run() async throws {
        // A daemon whose output closes goes on without it (systemd ignores SIGPIPE for its
        // services too): the narration's writes fail and are dropped.
        signal(SIGPIPE, SIG_IGN)
        let level: Logger.Level = verbose ? .info : .warning
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "hop-demo")
        let path = db ?? DatabaseLocation.defaultPath()
        // A server's URL is shown without its password (hopctl takes it from PGPASSWORD or ~/.pgpass).
        let shown = PostgresURL.isPostgresURL(path) ? PostgresURL.redact(path) : path
        let narrator = Narrator(database: shown, defaultDatabase: db == nil)
        narrator.say("hop-demo: database \(shown)")

        // Bootstrapped before the engine exists: the engine's metrics go to the process's MetricsSystem.
        // The engine and the flow start once the server listens: a port in use stops the daemon
        // before either begins anything (before, the engine had taken over a run in flight and
        // entered its step again by then).
        // One signal for each of the two services that wait for it (a stream has one reader).
        let (engineMayRun, engineGate) = AsyncStream.makeStream(of: Void.self)
        let (demoMayRun, demoGate) = AsyncStream.makeStream(of: Void.self)
        let listening: @Sendable () -> Void = { for gate in [engineGate, demoGate] { gate.yield() } }
        let metrics = metricsPort.map { port in
            MetricsEndpoint.bootstrap(port: port, logger: logger) { bound in
                narrator.say("hop-demo: metrics at http://127.0.0.1:\(bound)/metrics")
                listening()
            }
        }
        if metrics == nil { listening() }
        let (events, continuation) = AsyncStream.makeStream(of: DemoService.Event.self)
        let systemd = SystemdNotifier().map(SystemdStatus.init)
        let store = try await HopDatabase.open(path, logger: logger)
        let engine = HopEngine(
            database: store, logger: logger,
            configuration: .init(
                observer: { event in
                    continuation.yield(.engine(event))
                    systemd?.report(event)
                },
                engineID: "hop-demo@\(ProcessInfo.processInfo.hostName)"))
        registerStartupSteps(on: engine, newest: flowVersion)
        if flowVersion != "1" {
            narrator.say(
                "flow startup: versions 1 and \(flowVersion) registered; new runs start on version \(flowVersion)")
        }
        let outcome = Outcome()
        let demo = DemoService(
            engine: engine, store: store, events: events, ticks: continuation, narrator: narrator, subject: subject,
            auto: auto, outcome: outcome)
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                // Shut down in reverse order: the demo, the engine, then the metrics server.
                services: (metrics.map { [ServiceGroupConfiguration.ServiceConfiguration(service: $0)] } ?? []) + [
                    .init(
                        service: AfterListening(
                            service: EngineService(engine: engine, outcome: outcome), listening: engineMayRun)),
                    .init(
                        service: AfterListening(service: demo, listening: demoMayRun),
                        successTerminationBehavior: .gracefullyShutdownGroup),
                ],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger))
        try await group.run()
        systemd?.systemd.notify("STOPPING=1")
        continuation.finish()
        // A run that failed or diverged needs an operator: say so with the exit status.
        if let status = outcome.status.withLock({ $0 }), status == .failed || status == .diverged {
            throw ExitCode.failure
        }
    }
}

/// Under systemd (`Type=notify`): ready once the engine has resumed its runs; the status line
/// shows the step the start-up flow is at, or that the daemon waits for its database (and the
/// step again once the database answers).
final class SystemdStatus: Sendable {
    let systemd: SystemdNotifier
    /// The flow's last status line, shown again when the database answers.
    private let flowStatus = Mutex<String?>(nil)

    init(_ systemd: SystemdNotifier) { self.systemd = systemd }

    func report(_ event: EngineEvent) {
        switch event {
        case .ready:
            systemd.notify("READY=1")
        case .recorded(let run, let entry) where entry.kind == .hop && run.flow == "startup":
            show("STATUS=startup for \(run.subject) at \(entry.step ?? "?")")
        case .settled(let run) where run.flow == "startup":
            show("STATUS=startup for \(run.subject) \(run.status.rawValue)\(run.currentStep.map { " at \($0)" } ?? "")")
        case .databaseFailing(let error):
            // The code, not the whole error: a status line is one short line.
            systemd.notify("STATUS=waiting for the database (\(error.code)); the run goes on once it answers")
        case .databaseAnswers:
            if let status = flowStatus.withLock({ $0 }) { systemd.notify(status) }
        default:
            break
        }
    }

    private func show(_ status: String) {
        flowStatus.withLock { $0 = status }
        systemd.notify(status)
    }
}
