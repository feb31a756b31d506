import ArgumentParser
import Foundation
import HopEngine
import HopStore
import Logging
import ServiceLifecycle

/// A Linux daemon's start-up, made durable with Hop: splash, onboarding on first use,
/// login when no session is stored, then main.
@main
struct HopDemo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hop-demo",
        abstract: "Run the start-up flow of a daemon with Hop: splash, onboarding on first use, login without a stored session, main.")

    @Flag(help: "Finish onboarding and login automatically after a short pause.")
    var auto = false

    @Option(help: ArgumentHelp("The Hop database (default: $HOP_DB, else the state folder).", valueName: "path"))
    var db: String?

    @Option(help: ArgumentHelp("Whom the flow runs for.", valueName: "subject"))
    var subject = "default"

    @Flag(help: "Log what the engine does (info level) to standard error.")
    var verbose = false

    func run() async throws {
        let level: Logger.Level = verbose ? .info : .warning
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "hop-demo")
        let path = db ?? DatabaseLocation.defaultPath()
        let narrator = Narrator(database: path, defaultDatabase: db == nil)
        narrator.say("hop-demo: database \(path)")

        let (events, continuation) = AsyncStream.makeStream(of: EngineEvent.self)
        let store = try await HopStore.open(path: path, logger: logger)
        let engine = HopEngine(
            store: store, logger: logger,
            configuration: .init(
                observer: { continuation.yield($0) },
                engineID: "hop-demo@\(ProcessInfo.processInfo.hostName)"))
        registerStartupSteps(on: engine)
        let demo = DemoService(engine: engine, events: events, narrator: narrator, subject: subject, auto: auto)
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [
                    .init(service: engine),
                    .init(service: demo, successTerminationBehavior: .gracefullyShutdownGroup),
                ],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger))
        try await group.run()
        continuation.finish()
    }
}
