import Foundation
import Logging
import Synchronization
import Tracing

/// Executes one run, once: opens it (claims it and reads its history), runs the flow body
/// against its ``FlowContext`` and settles it — completed, parked, stopped, diverged or failed.
///
/// It owns the sequence of a hop: replay decides whether the hop is new (``Replay``), the hop is
/// recorded (``record(_:_:_:)``: every write of a run goes through it), the step is entered
/// (`RunExecutor+Steps.swift`) and its end returned to the body. Calls go one way: the flow
/// body's context and the step's context call the executor; the executor calls storage; it
/// never calls back into the engine, which learns how the execution ended from ``execute()``.
final class RunExecutor: FlowExecution {
    /// How an execution ended, for the engine to act on.
    enum Settlement: Sendable {
        /// Nothing more to do here (completed, failed, stopped, held elsewhere, parked).
        case settled
        /// The engine executes the run again, from its history, if it is running now: it parked
        /// on a step that a stored change ends, which may have come as it parked; a step was
        /// ended from outside as it returned here; or its history no longer ends where this
        /// execution last read or recorded it.
        case again
        /// Stopped: the engine let the run go, and `release` writes that (it may still be under
        /// way when the stop stopped waiting for it). The run is read for the observer once it ends.
        case stopped(release: Task<Void, Never>)
    }

    let run: RunRecord
    let definition: Flow
    let environment: ExecutionEnvironment
    private let claimed: ClaimedHistory?
    private let replay: Mutex<Replay>
    /// The unhop of the step that returned last, until the run's next record writes it
    /// (`HeldUnhops.swift`).
    let held = Mutex(HeldUnhop.none)
    /// The number of the last history entry this execution read or recorded: each of its
    /// writes follows it (``HopStorage/record(_:runID:owner:following:durability:)``), so that
    /// a history that changed without it (a failover that lost its last commits) is not
    /// written to as if it held what it saw.
    private let lastSeen = Mutex<Int64>(0)

    var storage: any HopStorage { environment.storage }

    /// - Parameter claimed: the run's history and when its lease was asked for, when the engine
    ///   has already claimed the run and read it (a resume of many runs does both in bulk).
    /// - Parameter bodyExecutor: where the flow body runs: the store's thread
    ///   (``HopStorage/flowExecutor``), or `nil` for the cooperative pool.
    init(
        run: RunRecord, definition: Flow, environment: ExecutionEnvironment, claimed: Claim?,
        bodyExecutor: (any TaskExecutor)?
    ) {
        self.run = run
        poolPreference = bodyExecutor == nil ? nil : globalConcurrentExecutor
        self.definition = definition
        self.environment = environment
        self.claimed = claimed.map(ClaimedHistory.init)
        let subject = Replay.Subject(
            runID: run.id, flow: run.flow, subject: run.subject, startedVersion: run.flowVersion,
            codeVersion: definition.version)
        replay = Mutex(Replay(subject: subject, history: []))
    }

    var isReplaying: Bool { replay.withLock { $0.isReplaying } }

    // A run's task stays suspended inside its step for as long as the step takes, holding the
    // async frames of every function between the task and the step. With thousands of runs in
    // flight those frames are the engine's memory, so the functions on that path (execute,
    // hop, enter, runStep) keep few locals and leave logging and error handling to helpers
    // that are not inlined into them.

    /// Runs the flow body against the run's history until it completes, parks, fails or is stopped.
    @inline(never)
    func execute() async -> Settlement {
        let span = startRunSpan()
        defer {
            dropHeldUnhop()  // every path that goes on wrote it; the others end the execution
            span.end()
        }
        do {
            guard try await open(span) else {
                span.setAttribute(SpanKey.outcome, SpanOutcome.notClaimed.rawValue)
                return .settled
            }
            // The body runs in the run span's context: its steps' spans (and any span a step
            // or a decision starts) are children of it.
            try await InstrumentationContext.$current.withValue(span.context) {
                try await definition.body(FlowContext(executor: self))
            }
            try await complete()
            span.setAttribute(SpanKey.outcome, SpanOutcome.completed.rawValue)
            return .settled
        } catch {
            return await settle(after: error, span: span)
        }
    }

    /// Claims the run (unless the engine did) and reads its history into replay; `false` when
    /// another engine holds it or it no longer runs.
    @inline(never)
    private func open(_ span: any Span) async throws -> Bool {
        let history: [HistoryEntry]
        if let claimed, let taken = claimed.take() {
            environment.hold(run.id, leasedAt: claimed.leasedAt)
            history = taken
        } else {
            guard let read = try await environment.claim(run) else { return false }
            history = read
        }
        let replaying = history.count { $0.kind.isReplayed }
        environment.notify(.executing(run: environment.ref(run), replaying: replaying))
        span.setAttribute(SpanKey.replayed, replaying)
        if replaying > 0 {
            environment.metrics.resumes.increment()
            environment.logger.info(
                "resuming run", metadata: environment.metadata(run).merging(["hop.replaying": "\(replaying)"]) { $1 })
        }
        replay.withLock { $0 = Replay(subject: $0.subject, history: history) }
        lastSeen.withLock { $0 = history.last?.seq ?? 0 }
        return true
    }

    // MARK: What the flow body asks for

    /// A hop to `step`: replayed, entered again, or recorded and entered.
    func hop(
        to step: String, timeout: Duration?, transition: (@Sendable (Transition) async throws -> Void)?
    ) async throws -> StepOutput {
        switch try replay.withLock({ try $0.consumeHop(to: step) }) {
        case .ended(let output):
            return output
        case .inFlight(let token, let deadline, let byTheWallClock):
            // In flight when the run stopped: enter it again, with the deadline it had.
            return try await enter(
                step: step, token: token, deadline: deadline, deadlineByTheWallClock: byTheWallClock, isReentry: true)
        case .new:
            let (token, deadline) = try await recordHop(to: step, timeout: timeout, transition: transition)
            return try await enter(step: step, token: token, deadline: deadline, isReentry: false)
        }
    }

    /// Runs the transition hook, then records a new hop to `step` (an external step parks the
    /// run in the same transaction); returns its token and deadline.
    @inline(never)
    private func recordHop(
        to step: String, timeout: Duration?, transition: (@Sendable (Transition) async throws -> Void)?
    ) async throws -> (token: String, deadline: Date?) {
        let from = replay.withLock { $0.lastStep }
        let hook = transition ?? definition.transition
        if let hook {
            let transition = Transition(flow: run.flow, subject: run.subject, runID: run.id, from: from, to: step)
            try await onThePool { try await hook(transition) }
        }
        let (parks, wakeOn) = try hopKind(of: step)
        let deadline = timeout.map { storage.now().addingTimeInterval($0.timeInterval) }
        // Parking gives the run up: from its commit on, no engine holds it, which is no loss.
        if parks { environment.holdings.withLock { $0.held[run.id] = nil } }
        let recordedFrom = hook == nil ? nil : from
        let entry = try await record(
            .hop(step: step, from: recordedFrom, parks: parks, wakeOn: wakeOn, deadline: deadline), durability: .now)
        environment.metrics.hops.increment()
        replay.withLock { $0.lastStep = step }
        return (entry.token ?? "", deadline)
    }

    /// Whether a hop to `step` parks the run (an external step), and on what stored change it wakes.
    private func hopKind(of step: String) throws -> (parks: Bool, wakeOn: WakeCondition?) {
        guard let registration = environment.step(named: step) else {
            throw HopError(
                .notRegistered,
                "run \(run.id) of flow '\(run.flow)' hops to step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\") before starting the engine"
            )
        }
        if case .external(let external) = registration.kind { return (true, external.wakeOn) }
        return (false, nil)
    }

    /// A durable sleep: the deadline is recorded, or replayed.
    func sleep(for duration: Duration, name: String) async throws {
        let deadline: Date
        var byTheWallClock = false
        if let recorded = try replay.withLock({ try $0.consume(.timer, name) }),
            let recordedDeadline = recorded.deadline
        {
            deadline = recordedDeadline
            byTheWallClock = recorded.deadlineGoesByTheWallClock
        } else {
            deadline = storage.now().addingTimeInterval(duration.timeInterval)
            try await record(.timer(name: name, deadline: deadline), durability: .now)
        }
        if deadline > storage.now() {
            try await writeHeldUnhop()  // a replayed timer writes nothing: the last step's end goes first
            try await wait(until: deadline, byTheWallClock: byTheWallClock)
        }
    }

    /// How often a wait for a deadline that goes by the wall clock reads the clock again.
    static let wallClockLook = Duration.seconds(1)

    /// The longest single sleep of a wait: about 31 years, well within the system timers' reach.
    static let longestSleep = Duration.seconds(1_000_000_000)

    /// Waits until `deadline` by the storage's clock (a durable sleep's, a step's timeout).
    ///
    /// A deadline of this process, or of this boot (kept by the uptime clock), or a server's is
    /// waited for at once on the monotonic clock, which a step of the wall clock does not move.
    /// One that goes `byTheWallClock` (``HistoryEntry/deadlineGoesByTheWallClock``: a file's,
    /// written in an earlier boot) is waited for a second at a time, the clock read again each
    /// time, so that it comes when the clock says once NTP has set a clock that booted stale.
    /// Before, a sleep or a step's timeout resumed on a device that booted with its clock an
    /// hour behind lasted an hour too long, however soon NTP set the clock right.
    ///
    /// No single sleep is longer than ``longestSleep``: the system's timers (dispatch's) take a
    /// deadline more than about 292 years ahead for "never", and the runtime's wake-up for such a
    /// sleep was never freed, cancelled or not (a step's timeout of `Int64.max / 2` seconds, found
    /// by `script/sanitize address`).
    func wait(until deadline: Date, byTheWallClock: Bool) async throws {
        var remaining = deadline.timeIntervalSince(storage.now())
        guard byTheWallClock else {
            guard remaining > 0 else { return }
            let end = ContinuousClock.now.advanced(by: Self.sleepDuration(seconds: remaining))
            var now = ContinuousClock.now
            while now < end {
                try await Task.sleep(until: min(end, now.advanced(by: Self.longestSleep)), clock: .continuous)
                now = ContinuousClock.now
            }
            return
        }
        while remaining > 0 {
            try await Task.sleep(for: Self.sleepDuration(seconds: min(remaining, Self.wallClockLook.timeInterval)))
            remaining = deadline.timeIntervalSince(storage.now())
        }
    }

    /// A decision of the flow's own: the recorded value, or `read`'s value (read on the
    /// cooperative pool: it is the daemon's code), recorded.
    func decide<T: Codable & Sendable>(_ name: String, _ read: @Sendable () async throws -> T) async throws -> T {
        try await decideStored(name) { try await self.onThePool(read) }
    }

    /// A decision: the recorded value, or `read`'s value, recorded.
    private func decideStored<T: Codable & Sendable>(
        _ name: String, _ read: @Sendable () async throws -> T
    ) async throws -> T {
        if let recorded = try replay.withLock({ try $0.consume(.decision, name) }) {
            return try JSONCoding.decode(
                T.self, from: recorded.value ?? "null", what: "the recorded decision '\(name)'")
        }
        let value = try await read()
        let json = try JSONCoding.encode(value)
        try await record(.decision(name: name, value: json), durability: .coalesced)
        return value
    }

    /// Whether the subject has never used `feature`, read once and recorded as a decision.
    func isFirstUse(_ feature: String) async throws -> Bool {
        try await decideStored(Self.firstUseDecision(feature)) { [storage, subject = run.subject] in
            try await storage.isFirstUse(subject: subject, feature: feature)
        }
    }

    /// The subject's session without its token, read once and recorded as a decision.
    func session() async throws -> SessionInfo? {
        try await decideStored(Self.sessionDecision) { [storage, subject = run.subject] in
            try await storage.session(subject: subject).map {
                SessionInfo(userID: $0.userID, createdAt: $0.createdAt, expiresAt: $0.expiresAt)
            }
        }
    }

    /// The daemon's fact `key` about the subject, read once and recorded as a decision.
    func fact(_ key: String) async throws -> String? {
        try await decideStored(Self.factDecision(key)) { [storage, subject = run.subject] in
            try await storage.fact(subject: subject, key: key)
        }
    }

    /// Which branch of patch `name` the run takes: the replayed one, or the new one, recorded.
    func patched(_ name: String) async throws -> Bool {
        if let replayed = try replay.withLock({ try $0.consumePatch(name) }) { return replayed }
        try await record(.patch(name: name), durability: .coalesced)
        return true
    }

    /// The effect of marking `feature` used: applied and recorded once, in one transaction.
    func markUsed(_ feature: String) async throws {
        let name = markUsedEffectName(feature)
        if try replay.withLock({ try $0.consume(.effect, name) }) != nil { return }
        try await record(.markUsed(feature: feature), durability: .coalesced)
    }

    /// Commits every record of this run (and of every other) applied so far, and the unhop of
    /// the step that returned last.
    func makeDurable() async throws {
        try await writeHeldUnhop()
        try await storage.makeDurable()
    }

    /// Stops this execution: every later call of the body throws `error`.
    func stop(_ error: any Error) {
        replay.withLock { $0.stop(error) }
    }

    /// Throws why this execution stopped, if it did.
    func throwIfStopped() throws {
        try replay.withLock { try $0.throwIfStopped() }
    }

    // MARK: Recording

    /// Commits one history entry through `commit`, handed the storage, the run's id and this
    /// engine's owner value, telling the observer before and after.
    /// A refusal because the run was finished or taken over elsewhere stops this execution.
    @discardableResult
    @inline(never)
    func record(
        _ kind: HistoryKind, _ name: String?,
        _ commit: @Sendable (_ storage: any HopStorage, _ runID: Int64, _ owner: String) async throws -> HistoryEntry
    ) async throws -> HistoryEntry {
        let ref = environment.ref(run)
        environment.notify(.willRecord(run: ref, kind: kind, step: name))
        let entry: HistoryEntry
        do {
            entry = try await commit(storage, run.id, environment.owner)
        } catch let error as HopError where error.code == .refused {
            try await stopIfFinishedElsewhere()
            // An unhop's refusal is judged by its caller, which first asks whether the step was
            // ended from outside (``writeHeldUnhop()``).
            if kind != .unhop { try await stopIfHistoryMoved() }
            throw error
        }
        recorded(entry)
        return entry
    }

    /// The last history entry this execution read or recorded: what its next write follows.
    var following: Int64 { lastSeen.withLock { $0 } }

    /// Tells the observer and the debug log that `entry` was recorded.
    func recorded(_ entry: HistoryEntry) {
        lastSeen.withLock { $0 = max($0, entry.seq) }
        environment.notify(.recorded(run: environment.ref(run), event: entry))
        environment.logger.debug(
            "recorded \(entry.kind.rawValue)",
            metadata: [
                "hop.run": "\(run.id)", "hop.flow": "\(run.flow)", "hop.subject": "\(run.subject)",
                "hop.step": "\(entry.step ?? "")",
            ])
    }

    /// When the run was finished or taken over elsewhere, stops this execution (it writes nothing more).
    func stopIfFinishedElsewhere() async throws {
        try stopIfFinishedElsewhere(as: try await storage.run(id: run.id))
    }

    /// When the run's history no longer ends at the last entry this execution read or recorded
    /// (``following``), stops this execution: the run is executed again from the history the
    /// database holds. It lost this execution's last commits (a failover to a standby that
    /// lacked them), or another writer moved it on.
    func stopIfHistoryMoved() async throws {
        let found = try await storage.history(runID: run.id, limit: 1).last?.seq ?? 0
        let expected = following
        guard found != expected else { return }
        let moved = Suspension.historyMoved(expected: expected, found: found)
        dropHeldUnhop()
        stop(moved)
        throw moved
    }

    /// ``stopIfFinishedElsewhere()`` for the run as the caller has just read it (`current`).
    func stopIfFinishedElsewhere(as current: RunRecord?) throws {
        if let current, !current.status.isUnfinished || current.owner != environment.owner {
            stop(Suspension.finished)
            throw Suspension.finished
        }
    }

    // MARK: Settling

    /// Records that the body returned: the run is completed.
    @inline(never)
    private func complete() async throws {
        try replay.withLock { try $0.finish() }
        // The run's end is a durable boundary: a completed run is durable once it settles.
        try await record(.complete, durability: .now)
        environment.logger.info("run completed", metadata: environment.metadata(run))
    }

    /// Settles an execution that ended with `error`: parked, stopped, diverged or failed.
    @inline(never)
    private func settle(after error: any Error, span: any Span) async -> Settlement {
        let logger = environment.logger(for: run)
        Self.outcome(of: span, endedBy: error)
        if environment.holdings.withLock({ $0.lost.contains(run.id) }) {  // said once, when lost
            span.setAttribute(SpanKey.outcome, SpanOutcome.finishedElsewhere.rawValue)
            return .settled
        }
        switch error {
        case Suspension.parked(let step):
            logger.debug("run parked on an external step", metadata: ["hop.step": "\(step)"])
            // A step that waits for a stored change that had already come ended as it parked.
            if case .external(let external)? = environment.step(named: step)?.kind, external.wakeOn != nil {
                return .again
            }
        case Suspension.finished:
            logger.info("run was finished or taken over elsewhere; stopped executing it, writing nothing more")
        case Suspension.endedElsewhere(let step):
            logger.info(
                "step was ended from outside before its unhop was written; executing the run again from its history",
                metadata: ["hop.step": "\(step)"])
            return .again
        case Suspension.historyMoved(let expected, let found):
            Self.logHistoryMoved(expected: expected, found: found, to: logger)
            return .again
        case _ where Task.isCancelled:
            logger.info("stopped executing run; it stays resumable")
            try? await writeHeldUnhop()  // the last step's end is kept: it does not run again
            // Released from a task of its own (this one is cancelled), and not waited for long.
            return .stopped(release: await environment.releaseAsStopping([run.id], what: "run \(run.id)"))
        case let error as HopError where error.code == .diverged:
            try? await writeHeldUnhop()
            // Judged on the history this execution read: not recorded once that is no longer
            // the database's, and judged again on the database's.
            let recorded = await recordEnd(.diverge, nil, logger) { storage, runID, owner, following in
                try await storage.divergeRun(
                    runID: runID, step: nil, message: error.reason, owner: owner, following: following)
            }
            if case .again = recorded { return .again }
            environment.metrics.divergences.increment()
            logger.error("run diverged", metadata: ["hop.error": "\(error)"])
        case let error as HopError where error.code == .stepFailed:
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
        case let error as HopError where error.isDatabaseFailure:
            // The database failed (busy, I/O): nothing was recorded, so the run stays resumable.
            logger.error("run stopped by a database error; it stays resumable", metadata: ["hop.error": "\(error)"])
            try? await storage.release(runID: run.id, owner: environment.owner)
            environment.holdings.withLock { $0.letGoAfterAFailure = true }
        default:
            try? await writeHeldUnhop()  // the body threw after its last step had ended
            if let current = try? await storage.run(id: run.id), current.status.isUnfinished {
                let recorded = await recordEnd(.fail, current.currentStep, logger) { storage, runID, owner, following in
                    try await storage.recordError(
                        runID: runID, step: current.currentStep, message: "\(error)", final: true, owner: owner,
                        following: following)
                }
                if case .again = recorded { return .again }
            }
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
        }
        return .settled
    }

    /// Records how the execution ended (``record(_:_:_:)``), whatever fails; `commit` is handed
    /// the last entry this execution read or recorded, which the record must follow. Returns
    /// `.again` when it was refused because the run's history no longer ends there (the run is
    /// executed again from the database's history), else `.settled`.
    private func recordEnd(
        _ kind: HistoryKind, _ name: String?, _ logger: Logger,
        _ commit:
            @Sendable (_ storage: any HopStorage, _ runID: Int64, _ owner: String, _ following: Int64)
            async throws -> HistoryEntry
    ) async -> Settlement {
        let following = following
        do {
            try await record(kind, name) { storage, runID, owner in
                try await commit(storage, runID, owner, following)
            }
        } catch Suspension.historyMoved(let expected, let found) {
            Self.logHistoryMoved(expected: expected, found: found, to: logger)
            return .again
        } catch {
            // Finished or taken over elsewhere, or the database failed: the run is as it is.
        }
        return .settled
    }

    private static func logHistoryMoved(expected: Int64, found: Int64, to logger: Logger) {
        logger.warning(
            "the run's history in the database does not end at the entry this engine recorded last: it lost this engine's last commits (a failover to a standby that lacked them, a database restored) or was written from outside; executing the run again from the history the database holds",
            metadata: ["hop.entry.expected": "\(expected)", "hop.entry.found": "\(found)"])
    }

    // MARK: Where code runs

    /// Runs the daemon's own code (a step's body, a transition hook, a decision's read) on
    /// Swift's cooperative pool. A flow body may run on the store's thread, where the store has
    /// one (``HopStorage/flowExecutor``) and few runs execute, beside the database; code that
    /// may block or compute at length must not hold that thread. Where the body is on the pool
    /// already, `body` runs where it is, with no switch.
    func onThePool<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        guard let pool = poolPreference else { return try await body() }
        return try await withTaskExecutorPreference(pool) { try await body() }
    }

    /// The executor the daemon's code must prefer: the pool when the flow body runs on the
    /// store's thread, `nil` (stay where it is) when it runs on the pool already.
    let poolPreference: (any TaskExecutor)?

    // MARK: Time

    /// `seconds` as a duration to sleep, at most about 300 years: a deadline read from the
    /// database never traps, however far ahead it lies.
    static func sleepDuration(seconds: TimeInterval) -> Duration {
        .milliseconds(Int64(max(0, min(seconds, 1e10)) * 1000))
    }
}

extension Duration {
    /// The duration in seconds, for `Date` arithmetic.
    var timeInterval: TimeInterval {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
