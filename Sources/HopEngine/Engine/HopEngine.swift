import CoreMetrics
import Foundation
import Logging

/// Executes flows durably over a `HopStore`: every hop is committed before its step starts
/// (with the run's unhops, decisions and effects recorded since the last one), and unfinished
/// runs resume where they were after a crash.
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
///
/// Where things happen: this file holds registration and steering; `HopEngine+Scheduling.swift`
/// the task of each run in flight; `Resume.swift` how runs are claimed and resumed;
/// `HopEngine+Watch.swift` the daemon's loop. A run's execution is `RunExecutor`'s.
public actor HopEngine {
    /// How many runs a resume claims and reads at a time.
    static let resumeBatch = 2000
    /// Below this many runs executing, a new execution's flow body runs on the store's thread
    /// (``HopStorage/flowExecutor``); from it on, on the cooperative pool. Measured with
    /// hop-bench: a lone flow is about 10 % faster beside the store, 10,000 runs resuming
    /// about 20 % faster on the pool; at 100 runs both are alike.
    package static let bodiesBesideTheStoreBelow = 8

    /// What the executions of this engine's runs share with it.
    nonisolated let environment: ExecutionEnvironment
    /// The engine's storage.
    package nonisolated var storage: any HopStorage { environment.storage }
    /// This engine's incarnation: the owner of the runs it executes, unique to this engine, and
    /// the liveness lock that lets other engines take its runs back at once when its process dies.
    public nonisolated var incarnation: Incarnation { environment.incarnation }
    /// This engine's owner value in the database (`Incarnation/id`): its label and a random part.
    public nonisolated var id: String { environment.incarnation.id }
    /// This engine's readable label: ``Configuration/engineID``, else host and process id.
    public nonisolated var label: String { environment.incarnation.label }
    nonisolated var logger: Logger { environment.logger }
    nonisolated var configuration: Configuration { environment.configuration }

    /// Runs being executed in this process, by id.
    var executing: [Int64: Task<Void, Never>] = [:]
    /// Runs asked to execute again while executing (an unhop arrived as they settled).
    var executeAgain: Set<Int64> = []
    var settleWaiters: [Int64: [CheckedContinuation<RunRecord?, Never>]] = [:]
    /// Runs asked to execute while ``Configuration/maxConcurrentRuns`` were executing, oldest first.
    var waiting = WaitingRuns()
    /// Whether the last resume left claimable runs in the database for want of free places.
    var claimableLeft = false
    /// Whether a resume is claiming runs now.
    var resuming = false
    /// Whether ``stopExecuting()`` is stopping the runs: no run starts executing meanwhile.
    var stopping = false
    /// The runs let go while stopping, whose leases the stop releases (this engine may hold them).
    var lettingGo: [Int64] = []
    /// How many stops began: a resume that claimed runs across a whole stop releases them.
    var stops = 0

    /// An engine over the SQLite database `store`.
    public init(store: HopStore, logger: Logger, configuration: Configuration = Configuration()) {
        self.init(storage: store, logger: logger, configuration: configuration)
    }

    /// An engine over `database`, whichever backend holds it (a SQLite file or a PostgreSQL
    /// server shared by a fleet of daemons): the same flows, the same guarantees.
    public init(database: HopDatabase, logger: Logger, configuration: Configuration = Configuration()) {
        self.init(storage: database.storage, logger: logger, configuration: configuration)
    }

    /// An engine over any storage.
    package init(storage: any HopStorage, logger: Logger, configuration: Configuration = Configuration()) {
        let configuration = configuration.adjusted(logger: logger)
        let incarnation = storage.makeIncarnation(
            label: configuration.engineID ?? "\(ProcessInfo.processInfo.hostName):\(getpid())")
        environment = ExecutionEnvironment(
            storage: storage, incarnation: incarnation, configuration: configuration,
            metrics: EngineMetrics(factory: configuration.metricsFactory ?? MetricsSystem.factory), logger: logger)
        if !incarnation.canProveLiveness {
            logger.warning(
                "cannot hold a liveness lock beside the database (is its folder writable?); if this process dies, its runs are taken over only when their leases expire",
                metadata: ["hop.db": "\(storage.location)"])
        }
    }

    // MARK: Registration

    /// Registers `flow` as the newest version of its name, beside the versions registered
    /// before it (or in place of a flow with the same name and version).
    ///
    /// A new run starts on the newest version, the one registered last (see
    /// ``start(_:subject:version:)``); an unfinished run always continues on the version it
    /// started with, and a run whose version is not registered here is left for an engine that has it.
    public nonisolated func register(_ flow: Flow) {
        environment.registry.withLock { $0.register(flow) }
    }

    /// Registers an in-process step whose work is `body`.
    public nonisolated func register(
        step name: String, retry: RetryPolicy = .none, _ body: @escaping @Sendable (StepContext) async throws -> Void
    ) {
        register(step: name, retry: retry, factory: { ClosureStep(body: body) })
    }

    /// Registers an in-process step made by `factory` for each hop to it: the daemon's own step host.
    public nonisolated func register(
        step name: String, retry: RetryPolicy = .none, factory: @escaping @Sendable () -> any HopStep
    ) {
        environment.registry.withLock { $0.steps[name] = .init(kind: .inProcess(factory), retry: retry) }
    }

    /// Registers a step that is finished from outside (see ``ExternalStep``).
    public nonisolated func register(step name: String, _ external: ExternalStep) {
        environment.registry.withLock { $0.steps[name] = .init(kind: .external(external), retry: .none) }
    }

    // MARK: Starting and steering runs

    /// Starts a run of `flow` for `subject`, or resumes its unfinished run, and executes it
    /// in the background. Returns the run as stored, once it is durable.
    ///
    /// A new run is written together with its first hop (one commit, not two): the run begins
    /// executing at once, and this call returns when that commit is done (at the latest a few
    /// milliseconds after the run was written, whatever the flow body does first).
    ///
    /// - Parameters:
    ///   - flow: the registered flow's name.
    ///   - subject: whom the run is for.
    ///   - version: the registered version a new run starts on; the newest (registered last) by
    ///     default. An unfinished run continues on its own version whatever is asked.
    @discardableResult
    public func start(_ flow: String, subject: String = "default", version: String? = nil) async throws -> RunRecord {
        guard let definition = environment.flow(named: flow, version: version) else {
            if let version, environment.flow(named: flow) != nil {
                let registered = environment.flowVersions[flow, default: []].joined(separator: ", ")
                throw HopError(
                    .notRegistered,
                    "version '\(version)' of flow '\(flow)' is not registered (registered: \(registered))",
                    hint: "Register it with engine.register(Flow(\"\(flow)\", version: \"\(version)\") { … })")
            }
            throw HopError(
                .notRegistered,
                "no flow is registered under '\(flow)': register it with engine.register(Flow(\"\(flow)\", …))")
        }
        let leasedAt = ContinuousClock.now
        let (run, created) = try await storage.startRun(
            flow: flow, subject: subject, version: definition.version, owner: id, until: environment.leaseEnd,
            durability: .coalesced)
        if created {
            logger.info("started run", metadata: environment.metadata(run))
            execute(run, claimed: Claim(history: [], leasedAt: leasedAt))  // held since it was written, with no history
        } else if run.status == .running {
            execute(run)
        }
        try await storage.waitUntilDurable(runID: run.id)
        return run
    }

    /// Makes every record applied so far durable now.
    ///
    /// The engine commits a run's decisions, effects (``FlowContext/markUsed(_:)``) and its
    /// steps' unhops with the run's next hop, parking, timer or completion, or a few
    /// milliseconds later, whichever comes first, rather than each in a commit of its own (see
    /// the README's "Durability"). Call this when something outside must be able to rely on
    /// them now, or before the process exits on its own (``run()`` does it when it stops).
    /// The unhops of steps that returned, which the engine holds until their run's next record,
    /// are written first.
    public func makeDurable() async throws {
        await environment.heldUnhops.writeAll()
        try await storage.makeDurable()
    }

    /// Finishes the step that the unfinished run of `flow` for `subject` has in flight, with
    /// `token` (from ``inFlight(flow:subject:)``), exactly once; then the run proceeds.
    /// - Throws: `HopError` with code `.refused`, changing nothing, for a stale token, a second
    ///   unhop or a finished run, or when there is no unfinished run.
    public func unhop(
        flow: String, subject: String = "default", token: String, output: (some Encodable & Sendable)? = String?.none
    ) async throws {
        guard let run = try await storage.latestRun(flow: flow, subject: subject), run.status.isUnfinished else {
            throw HopError(.refused, "there is no unfinished run of flow '\(flow)' for subject '\(subject)' to unhop")
        }
        let json = try output.map { try JSONCoding.encode($0) }
        let entry = try await storage.recordUnhop(
            runID: run.id, token: token, output: json, owner: nil, durability: .now)
        environment.metrics.unhops.increment()
        environment.notify(.recorded(run: environment.ref(run), event: entry))
        await execute(runIDs: [run.id])
    }

    /// Finishes `step`, on which the unfinished run of `flow` for `subject` is parked, exactly
    /// once; then the run proceeds. Addressed by step, so a retry never finishes another step
    /// after it; name the parking with `runID` and `entry` when the flow may park on `step` again.
    ///
    /// - Parameters:
    ///   - flow: the flow's name.
    ///   - subject: whom the run is for.
    ///   - step: the step the run is parked on.
    ///   - runID: the run meant: refused unless it is the subject's unfinished run of the flow.
    ///   - entry: with `runID`, the history entry of the hop that parked the run on `step`
    ///     (``HopEngine/parking(flow:subject:)``): refused once that step has ended, even when
    ///     the run is parked on `step` again (a retry never finishes the next parking).
    ///   - output: the step's output.
    /// - Throws: `HopError` with code `.refused`, changing nothing, when the run is not parked on
    ///   `step` (or not by `entry`), or `step` finishes when a session is stored (use
    ///   ``storeSession(subject:userID:token:expiresAt:)``); `.notFound` without an unfinished
    ///   run, or when `runID` or `entry` names no such run or hop.
    public func unhop(
        flow: String, subject: String = "default", step: String, run runID: Int64? = nil, entry: Int64? = nil,
        output: (some Encodable & Sendable)? = String?.none
    ) async throws {
        let json = try output.map { try JSONCoding.encode($0) }
        let (run, event) = try await storage.unhopParked(
            flow: flow, subject: subject, step: step, runID: runID, entry: entry, output: json)
        environment.metrics.unhops.increment()
        environment.notify(.recorded(run: environment.ref(run), event: event))
        execute(run)
    }

    /// Where the unfinished run of `flow` for `subject` is parked: the run, its step and the
    /// history entry that parked it, which ``unhop(flow:subject:step:run:entry:output:)`` names
    /// so that a retry never finishes a later parking on the same step. `nil` unless it is parked.
    public func parking(
        flow: String, subject: String = "default"
    ) async throws -> (
        run: Int64, step: String, entry: Int64
    )? {
        guard let run = try await storage.latestRun(flow: flow, subject: subject), run.status == .parked,
            let step = run.currentStep
        else { return nil }
        guard let entry = try await storage.stepEntries(runIDs: [run.id])[run.id] else { return nil }
        return (run.id, step, entry)
    }

    /// The step the unfinished run of `flow` for `subject` has in flight, and its token.
    public func inFlight(flow: String, subject: String = "default") async throws -> (step: String, token: String)? {
        guard let run = try await storage.latestRun(flow: flow, subject: subject), run.status.isUnfinished,
            let step = run.currentStep, let token = run.currentToken
        else { return nil }
        return (step, token)
    }

    /// Cancels the unfinished run of `flow` for `subject`: its in-flight step's task is
    /// cancelled and the run never advances again. History is kept.
    ///
    /// - Parameters:
    ///   - flow: the flow's name.
    ///   - subject: whom the run is for.
    ///   - runID: the run meant, so that a retried call changes nothing: refused (`.refused`)
    ///     unless it is the subject's unfinished run of the flow.
    @discardableResult
    public func cancel(flow: String, subject: String = "default", run runID: Int64? = nil) async throws -> RunRecord {
        let run = try await storage.cancelRun(flow: flow, subject: subject, runID: runID, reason: "cancelled")
        executing[run.id]?.cancel()
        logger.info("cancelled run", metadata: environment.metadata(run))
        return run
    }

    /// Ends the latest run of `flow` for `subject` and starts the flow over in a new run, on
    /// the newest registered version (the old run's version when none is registered here).
    ///
    /// - Parameters:
    ///   - flow: the flow's name.
    ///   - subject: whom the run is for.
    ///   - runID: the run meant, so that a retried call never starts over the run the first one
    ///     made: refused (`.refused`) unless it is the subject's latest run of the flow.
    @discardableResult
    public func restart(flow: String, subject: String = "default", run runID: Int64? = nil) async throws -> RunRecord {
        var old = runID
        if old == nil { old = try await storage.latestRun(flow: flow, subject: subject)?.id }
        let run = try await storage.restartRun(
            flow: flow, subject: subject, runID: runID, version: environment.flow(named: flow)?.version)
        // The old run's step in flight is cancelled once the restart is written, not before: a
        // restart the database refused leaves it running. (Its writes meanwhile are refused:
        // the run has ended.)
        if let old { executing[old]?.cancel() }
        execute(run)
        return run
    }

    /// The time by the database's clock: this machine's for a file, the server's (as last
    /// measured) for PostgreSQL. Deadlines, step timeouts and session expiry are judged by it;
    /// compute a session's `expiresAt` from it (`engine.now().addingTimeInterval(3600)`) so that
    /// a machine whose clock is off does not store a session that expires early or late.
    public nonisolated func now() -> Date { storage.now() }

    /// Stores the session of `subject` and moves on the subject's runs parked on a step that
    /// waits for a login (``ExternalStep/external(unhopWhen:)`` with `.sessionStored`).
    ///
    /// Use this rather than `HopStore/storeSession(subject:userID:token:expiresAt:)` inside a
    /// daemon: the engine does not watch its own writes, only other processes'.
    public func storeSession(subject: String, userID: String, token: String, expiresAt: Date? = nil) async throws {
        let woken = try await storage.storeSession(subject: subject, userID: userID, token: token, expiresAt: expiresAt)
        await execute(runIDs: woken)
    }

    /// Removes the session of `subject` and re-routes the subject's runs parked on a step that
    /// lasts only while a session is stored (`WakeCondition/sessionRemoved`).
    ///
    /// - Parameters:
    ///   - subject: whose session it is.
    ///   - userID: the user whose session is meant, so that a retried call never logs out the
    ///     next user: refused (`.refused`), changing nothing, when another user's is stored.
    /// - Returns: whether a session was stored.
    @discardableResult
    public func deleteSession(subject: String, userID: String? = nil) async throws -> Bool {
        let (removed, rerouted) = try await storage.deleteSession(subject: subject, userID: userID)
        await execute(runIDs: rerouted)
        return removed
    }

    // MARK: Observing runs

    /// Waits until this engine is no longer executing run `runID` (it completed, failed,
    /// parked, …) and returns the run as stored.
    public func settled(runID: Int64) async throws -> RunRecord? {
        if executing[runID] != nil || waiting.contains(runID),
            let settled = await withCheckedContinuation({ (continuation: CheckedContinuation<RunRecord?, Never>) in
                // Checked again: the closure may run after other work of the engine's (see
                // `HopStore.waitUntilDurable`), by which time the run may have settled.
                guard executing[runID] != nil || waiting.contains(runID) else {
                    continuation.resume(returning: nil)
                    return
                }
                environment.holdings.withLock { _ = $0.awaited.insert(runID) }
                settleWaiters[runID, default: []].append(continuation)
            })
        {
            return settled
        }
        return try await storage.run(id: runID)
    }

    /// Whether this engine is executing run `runID` now.
    public func isExecuting(runID: Int64) -> Bool { executing[runID] != nil }

    /// How many runs this engine executes now (at most ``Configuration/maxConcurrentRuns``).
    public var executingCount: Int { executing.count }
    /// How many runs wait for a free place to execute.
    public var waitingCount: Int { waiting.count }
}
