import CoreMetrics
import Foundation
import HopStore
import Logging
import Synchronization

/// Executes flows durably over a ``HopStore``: every hop, unhop and decision is committed
/// before the flow proceeds, and unfinished runs resume where they were after a crash.
///
/// ```swift
/// let engine = HopEngine(store: store, logger: logger)
/// engine.register(startup)
/// engine.register(step: "splash") { step in await cache.reload() }
/// engine.register(step: "onboarding", .external)
/// try await engine.start("startup")
/// ```
///
/// Guarantees: a step that unhopped is never run again for that hop; a decision returns
/// the value it first recorded; an unhop is applied exactly once. A step in flight when
/// the process died runs again when the run resumes (at-least-once for step bodies).
public actor HopEngine {
    /// How an engine behaves.
    public struct Configuration: Sendable {
        /// How often the engine checks the database for changes made by other processes
        /// (an unhop, a cancellation, a logout by `hopctl`) and for steps whose deadline passed.
        public var pollInterval: Duration = .milliseconds(50)
        /// How long a lease on a run lasts. The engine renews its leases three times per
        /// period; when its process dies, another engine takes its runs over once they expire.
        public var leaseDuration: Duration = .seconds(10)
        /// Called with each ``EngineEvent``.
        public var observer: (@Sendable (EngineEvent) -> Void)?
        /// Where metrics go; the process's `MetricsSystem` when `nil`.
        public var metricsFactory: (any MetricsFactory)?
        /// A readable label for this daemon, e.g. `"kiosk-agent@device-17"`, shown by
        /// `hopctl status` and in takeover entries of history; host and process id by default.
        /// It is only a label: ownership of runs goes by the engine's ``HopEngine/incarnation``,
        /// so any number of processes may share a label without ever executing a run twice.
        public var engineID: String?

        public init(
            pollInterval: Duration = .milliseconds(50), leaseDuration: Duration = .seconds(10),
            observer: (@Sendable (EngineEvent) -> Void)? = nil, metricsFactory: (any MetricsFactory)? = nil,
            engineID: String? = nil
        ) {
            self.pollInterval = pollInterval
            self.leaseDuration = leaseDuration
            self.observer = observer
            self.metricsFactory = metricsFactory
            self.engineID = engineID
        }
    }

    struct StepRegistration: Sendable {
        enum Kind: Sendable {
            case inProcess(@Sendable () -> any HopStep)
            case external(ExternalStep)
        }
        var kind: Kind
        var retry: RetryPolicy
    }

    struct Registry: Sendable {
        var flows: [String: Flow] = [:]
        var steps: [String: StepRegistration] = [:]
    }

    /// How many runs a resume claims and reads at a time.
    static let resumeBatch = 2000

    /// The engine's database.
    public nonisolated let store: HopStore
    /// This engine's incarnation: the owner of the runs it executes, unique to this engine, and
    /// the liveness lock that lets other engines take its runs back at once when its process dies.
    public nonisolated let incarnation: Incarnation
    /// This engine's owner value in the database (``Incarnation/id``): its label and a random part.
    public nonisolated var id: String { incarnation.id }
    /// This engine's readable label: ``Configuration/engineID``, else host and process id.
    public nonisolated var label: String { incarnation.label }
    nonisolated let metrics: EngineMetrics
    nonisolated let logger: Logger
    nonisolated let configuration: Configuration
    private nonisolated let registry = Mutex(Registry())

    /// Runs being executed in this process, by id.
    var executing: [Int64: Task<Void, Never>] = [:]
    /// The runs of `executing` that this engine has claimed (it holds their lease), and those
    /// it found it lost (another engine took them over): their executions stop without a write.
    nonisolated let holdings = Mutex(Holdings())
    /// Runs asked to execute again while executing (an unhop arrived as they settled).
    var executeAgain: Set<Int64> = []
    var settleWaiters: [Int64: [CheckedContinuation<Void, Never>]] = [:]

    public init(store: HopStore, logger: Logger, configuration: Configuration = Configuration()) {
        self.store = store
        self.logger = logger
        self.configuration = configuration
        incarnation = store.makeIncarnation(label: configuration.engineID ?? "\(ProcessInfo.processInfo.hostName):\(getpid())")
        metrics = EngineMetrics(factory: configuration.metricsFactory ?? MetricsSystem.factory)
        if !incarnation.canProveLiveness {
            logger.warning(
                "cannot hold a liveness lock beside the database (is its folder writable?); if this process dies, its runs are taken over only when their leases expire",
                metadata: ["hop.db": "\(store.path)"])
        }
    }

    // MARK: Registration

    /// Registers `flow` under its name, replacing any flow registered under that name.
    public nonisolated func register(_ flow: Flow) {
        registry.withLock { $0.flows[flow.name] = flow }
    }

    /// Registers an in-process step whose work is `body`.
    public nonisolated func register(
        step name: String, retry: RetryPolicy = .none, _ body: @escaping @Sendable (StepContext) async throws -> Void
    ) {
        register(step: name, retry: retry, factory: { ClosureStep(body: body) })
    }

    /// Registers an in-process step made by `factory` for each hop to it: the daemon's own step host.
    public nonisolated func register(step name: String, retry: RetryPolicy = .none, factory: @escaping @Sendable () -> any HopStep) {
        registry.withLock { $0.steps[name] = StepRegistration(kind: .inProcess(factory), retry: retry) }
    }

    /// Registers a step that is finished from outside (see ``ExternalStep``).
    public nonisolated func register(step name: String, _ external: ExternalStep) {
        registry.withLock { $0.steps[name] = StepRegistration(kind: .external(external), retry: .none) }
    }

    nonisolated func flow(named name: String) -> Flow? { registry.withLock { $0.flows[name] } }
    nonisolated func step(named name: String) -> StepRegistration? { registry.withLock { $0.steps[name] } }
    nonisolated var flowNames: [String] { registry.withLock { Array($0.flows.keys).sorted() } }

    // MARK: Starting and steering runs

    /// Starts a run of `flow` for `subject`, or resumes its unfinished run, and executes it
    /// in the background. Returns the run as stored.
    @discardableResult
    public func start(_ flow: String, subject: String = "default") async throws -> RunRecord {
        guard let definition = self.flow(named: flow) else {
            throw HopEngineError(.notRegistered, "no flow is registered under '\(flow)': register it with engine.register(Flow(\"\(flow)\", …))")
        }
        let (run, created) = try await store.startRun(flow: flow, subject: subject, version: definition.version)
        if created { logger.info("started run", metadata: metadata(run)) }
        if run.status == .running { execute(run) }
        return run
    }

    /// Resumes every unfinished, unparked run of the registered flows that no other engine
    /// holds (its lease expired, it has none, or its process is gone); returns how many.
    @discardableResult
    public func resumeAll() async throws -> Int {
        try await releaseRunsOfDeadEngines()
        return try await resumeClaimable()
    }

    /// Claims and executes the runs no live engine holds (`resumeAll` without looking for dead
    /// engines first: the watch has just looked).
    @discardableResult
    func resumeClaimable() async throws -> Int {
        let candidates = try await store.claimableRuns(flows: flowNames)
        var resumed = 0
        // In batches: one transaction claims a batch, one statement reads its histories, and
        // its runs start while the next batch is read.
        for start in stride(from: 0, to: candidates.count, by: Self.resumeBatch) {
            let batch = candidates[start..<min(start + Self.resumeBatch, candidates.count)].map(\.id)
            let claimed = try await store.claim(runIDs: batch, owner: id, until: leaseEnd)
            let histories = try await store.histories(runIDs: claimed.map(\.id))
            for run in claimed {
                if executing[run.id] == nil {
                    execute(run, claimed: histories[run.id] ?? [])
                } else {
                    executeAgain.insert(run.id)  // an execution that could not claim it is settling
                }
                resumed += 1
            }
        }
        if resumed > 0 { logger.info("resuming unfinished runs", metadata: ["hop.runs": "\(resumed)"]) }
        return resumed
    }

    /// Finishes the step that the unfinished run of `flow` for `subject` has in flight, with
    /// `token` (from ``inFlight(flow:subject:)``), exactly once; then the run proceeds.
    /// - Throws: `HopStoreError` of kind `.refused`, changing nothing, for a stale token, a second
    ///   unhop or a finished run.
    public func unhop(flow: String, subject: String = "default", token: String, output: (some Encodable & Sendable)? = String?.none) async throws {
        guard let run = try await store.latestRun(flow: flow, subject: subject), run.status.isUnfinished else {
            throw HopEngineError(.refused, "there is no unfinished run of flow '\(flow)' for subject '\(subject)' to unhop")
        }
        let json = try output.map { try JSONCoding.encode($0) }
        let event = try await store.recordUnhop(runID: run.id, token: token, output: json)
        metrics.unhops.increment()
        notify(.recorded(run: ref(run), event: event))
        if let updated = try await store.run(id: run.id) { execute(updated) }
    }

    /// Finishes `step`, on which the unfinished run of `flow` for `subject` is parked, exactly
    /// once; then the run proceeds. Addressed by step, so a retry never finishes the step after it.
    /// - Throws: `HopStoreError` of kind `.refused`, changing nothing, when the run is not parked on
    ///   `step` or `step` finishes when a session is stored (use ``storeSession(subject:userID:token:expiresAt:)``);
    ///   `.notFound` without an unfinished run.
    public func unhop(flow: String, subject: String = "default", step: String, output: (some Encodable & Sendable)? = String?.none) async throws {
        let json = try output.map { try JSONCoding.encode($0) }
        let (run, event) = try await store.unhopParked(flow: flow, subject: subject, step: step, output: json)
        metrics.unhops.increment()
        notify(.recorded(run: ref(run), event: event))
        execute(run)
    }

    /// The step the unfinished run of `flow` for `subject` has in flight, and its token.
    public func inFlight(flow: String, subject: String = "default") async throws -> (step: String, token: String)? {
        guard let run = try await store.latestRun(flow: flow, subject: subject), run.status.isUnfinished,
            let step = run.currentStep, let token = run.currentToken
        else { return nil }
        return (step, token)
    }

    /// Cancels the unfinished run of `flow` for `subject`: its in-flight step's task is
    /// cancelled and the run never advances again. History is kept.
    @discardableResult
    public func cancel(flow: String, subject: String = "default") async throws -> RunRecord {
        let run = try await store.cancelRun(flow: flow, subject: subject)
        executing[run.id]?.cancel()
        logger.info("cancelled run", metadata: metadata(run))
        return run
    }

    /// Ends the latest run of `flow` for `subject` and starts the flow over in a new run.
    @discardableResult
    public func restart(flow: String, subject: String = "default") async throws -> RunRecord {
        if let old = try await store.latestRun(flow: flow, subject: subject) { executing[old.id]?.cancel() }
        let run = try await store.restartRun(flow: flow, subject: subject)
        if self.flow(named: flow) != nil { execute(run) }
        return run
    }

    /// Waits until this engine is no longer executing run `runID` (it completed, failed,
    /// parked, …) and returns the run as stored.
    public func settled(runID: Int64) async throws -> RunRecord? {
        if executing[runID] != nil {
            await withCheckedContinuation { settleWaiters[runID, default: []].append($0) }
        }
        return try await store.run(id: runID)
    }

    /// Whether this engine is executing run `runID` now.
    public func isExecuting(runID: Int64) -> Bool { executing[runID] != nil }

    /// How many runs this engine holds in memory.
    public var executingCount: Int { executing.count }

    /// Releases the runs held by engines on this host whose process is gone (their liveness
    /// lock is free), so that they are claimed at once rather than when their leases expire.
    /// Returns how many runs were released.
    @discardableResult
    func releaseRunsOfDeadEngines() async throws -> Int {
        var released = 0
        for (owner, runs) in try await store.releaseRunsOfDeadIncarnations(except: incarnation) where runs > 0 {
            released += runs
            logger.info(
                "an engine's process is gone; its runs are taken over",
                metadata: ["hop.engine": "\(Incarnation.label(of: owner))", "hop.incarnation": "\(owner)", "hop.runs": "\(runs)"])
        }
        return released
    }

    // MARK: Helpers

    nonisolated func notify(_ event: EngineEvent) { configuration.observer?(event) }

    nonisolated func ref(_ run: RunRecord) -> RunRef { RunRef(id: run.id, flow: run.flow, subject: run.subject) }

    nonisolated func metadata(_ run: RunRecord, step: String? = nil) -> Logger.Metadata {
        var metadata: Logger.Metadata = ["hop.run": "\(run.id)", "hop.flow": "\(run.flow)", "hop.subject": "\(run.subject)"]
        if let step { metadata["hop.step"] = "\(step)" }
        return metadata
    }
}

extension HopEngine {
    /// Stores the session of `subject` and moves on the subject's runs parked on a step that
    /// waits for a login (``ExternalStep/external(unhopWhen:)`` with `.sessionStored`).
    ///
    /// Use this rather than ``HopStore/storeSession(subject:userID:token:expiresAt:)`` inside a
    /// daemon: the engine does not watch its own writes, only other processes'.
    public func storeSession(subject: String, userID: String, token: String, expiresAt: Date? = nil) async throws {
        let woken = try await store.storeSession(subject: subject, userID: userID, token: token, expiresAt: expiresAt)
        for runID in woken {
            if let run = try await store.run(id: runID) { execute(run) }
        }
    }

    /// Removes the session of `subject` and re-routes the subject's runs parked on a step that
    /// lasts only while a session is stored (``WakeCondition/sessionRemoved``).
    @discardableResult
    public func deleteSession(subject: String) async throws -> Bool {
        let (removed, rerouted) = try await store.deleteSession(subject: subject)
        for runID in rerouted {
            if let run = try await store.run(id: runID) { execute(run) }
        }
        return removed
    }
}
