import Foundation
import Logging
import Synchronization
import Tracing

/// What an engine shares with the executions of its runs: storage, identity, registry,
/// holdings, metrics, tracing, logging and the observer. Executions reach the engine's state only
/// through it, never through the engine actor, so the calls go one way: engine → executor →
/// storage.
final class ExecutionEnvironment: Sendable {
    let storage: any HopStorage
    /// The owner of the runs this engine executes.
    let incarnation: Incarnation
    let configuration: HopEngine.Configuration
    let metrics: EngineMetrics
    let tracer: any Tracer
    let logger: Logger
    let registry = Mutex(Registry())
    /// Which runs this engine holds, and which it found it lost.
    let holdings = Mutex(Holdings())
    /// Ends the wait of the engine's lease renewals early (``hold(_:leasedAt:)``).
    let renewalWakeup = Wakeup()
    /// The runs whose executor holds the unhop of a step that returned.
    let heldUnhops: HeldUnhops

    init(
        storage: any HopStorage, incarnation: Incarnation, configuration: HopEngine.Configuration,
        metrics: EngineMetrics, logger: Logger
    ) {
        self.storage = storage
        self.incarnation = incarnation
        self.configuration = configuration
        self.metrics = metrics
        self.tracer = configuration.tracer ?? InstrumentationSystem.tracer
        self.logger = logger
        heldUnhops = HeldUnhops(limit: configuration.heldUnhopLimit)
    }

    /// Holds run `runID`, whose lease this engine asked for at `leasedAt`. When a renewal asked
    /// for more than a third of a lease later left it out (the claim waited: for SQLite's write
    /// lock another process held, or a row another client locked), the next renewal goes at
    /// once: the lease, taken when it was asked for, may be all but over, and the next renewal
    /// was due only a third of a lease after the one that left it out.
    func hold(_ runID: Int64, leasedAt: ContinuousClock.Instant) {
        let late = holdings.withLock {
            $0.hold(runID, leasedAt: leasedAt, renewedEvery: configuration.leaseDuration / 3)
        }
        if late { renewalWakeup.wake() }
    }

    /// The owner value this engine writes with.
    var owner: String { incarnation.id }

    /// Version `version` of flow `name` (its newest when `nil`), if registered.
    func flow(named name: String, version: String? = nil) -> Flow? {
        registry.withLock { $0.flow(named: name, version: version) }
    }
    /// The registered versions of each flow, in registration order.
    var flowVersions: [String: [String]] { registry.withLock { $0.versions } }
    func step(named name: String) -> Registry.StepRegistration? { registry.withLock { $0.steps[name] } }

    /// When this engine's lease on a run taken now ends.
    var leaseEnd: Date {
        storage.now().addingTimeInterval(configuration.leaseDuration.timeInterval)
    }

    func notify(_ event: EngineEvent) { configuration.observer?(event) }

    /// Whether the engine will want run `runID` as stored once its execution settles: an
    /// observer is told, or a caller waits for it.
    func wantsSettledRun(_ runID: Int64) -> Bool {
        configuration.observer != nil || holdings.withLock { $0.awaited.contains(runID) }
    }

    func ref(_ run: RunRecord) -> RunRef { RunRef(id: run.id, flow: run.flow, subject: run.subject) }

    /// The engine's logger with the run's metadata.
    func logger(for run: RunRecord) -> Logger {
        var logger = self.logger
        logger[metadataKey: "hop.run"] = "\(run.id)"
        logger[metadataKey: "hop.flow"] = "\(run.flow)"
        logger[metadataKey: "hop.subject"] = "\(run.subject)"
        return logger
    }

    func metadata(_ run: RunRecord, step: String? = nil) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "hop.run": "\(run.id)", "hop.flow": "\(run.flow)", "hop.subject": "\(run.subject)",
        ]
        if let step { metadata["hop.step"] = "\(step)" }
        return metadata
    }
}
