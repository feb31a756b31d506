import Foundation
import HopStore
import Logging
import Synchronization

extension HopEngine {
    /// Executes `run` in a task of its own, unless this engine is executing it already
    /// (then it executes once more as soon as the current execution settles).
    ///
    /// - Parameter claimed: the run's history, when this engine has already claimed the run
    ///   and read it (a resume of many runs does both in bulk).
    func execute(_ run: RunRecord, claimed: [HistoryEvent]? = nil) {
        guard executing[run.id] == nil else {
            executeAgain.insert(run.id)
            return
        }
        guard let definition = flow(named: run.flow) else {
            logger.warning("a run of an unregistered flow is not executed", metadata: metadata(run))
            return
        }
        // The task holds the history only until the run has opened it (see ClaimedHistory).
        let claimed = claimed.map(ClaimedHistory.init)
        executing[run.id] = Task { [self] in
            await self.perform(run, definition: definition, claimed: claimed)
            await self.didSettle(run.id)
        }
    }

    /// Has run `runID` executed again once it settles, if it is running (not parked) now.
    private func executeAgainIfWoken(_ runID: Int64) async {
        if let run = try? await store.run(id: runID), run.status == .running { executeAgain.insert(runID) }
    }

    private func didSettle(_ runID: Int64) async {
        executing[runID] = nil
        holdings.withLock { $0.settled(runID) }
        if executeAgain.remove(runID) != nil, let run = try? await store.run(id: runID), run.status == .running,
            executing[runID] == nil
        {
            execute(run)
            return
        }
        if let run = try? await store.run(id: runID) { notify(.settled(run: run)) }
        for waiter in settleWaiters.removeValue(forKey: runID) ?? [] { waiter.resume() }
    }

    /// When this engine's lease on a run taken now ends.
    nonisolated var leaseEnd: Date {
        Date().addingTimeInterval(Double(configuration.leaseDuration.components.seconds)
            + Double(configuration.leaseDuration.components.attoseconds) / 1e18)
    }

    // A run's task stays suspended inside its step for as long as the step takes, holding the
    // async frames of every function between the task and the step. With thousands of runs in
    // flight those frames are the engine's memory, so the functions on that path (perform,
    // FlowRun.hop, enter, runStep) keep few locals and leave logging and error handling to
    // helpers that are not inlined into them.

    /// Runs the flow body against the run's history until it completes, parks, fails or is stopped.
    @inline(never)
    private nonisolated func perform(_ run: RunRecord, definition: Flow, claimed: ClaimedHistory?) async {
        var flowRun: FlowRun?
        do {
            guard let handle = try await open(run, definition: definition, claimed: claimed) else { return }
            flowRun = handle
            try await definition.body(handle)
            try await complete(handle)
        } catch {
            await settle(run, after: error, flowRun: flowRun)
        }
    }

    /// Claims the run (unless `claimed` holds its history) and reads its history; `nil` when
    /// another engine holds it or it no longer runs.
    @inline(never)
    private nonisolated func open(_ run: RunRecord, definition: Flow, claimed: ClaimedHistory?) async throws -> FlowRun? {
        if let history = claimed?.take() {
            holdings.withLock { _ = $0.held.insert(run.id) }
            return opened(run, definition: definition, history: history)
        }
        guard let history = try await claim(run) else { return nil }
        return opened(run, definition: definition, history: history)
    }

    /// Claims the run for this engine and reads its history; `nil` when another live engine holds it.
    @inline(never)
    private nonisolated func claim(_ run: RunRecord) async throws -> [HistoryEvent]? {
        if try await store.claim(runID: run.id, owner: id, until: leaseEnd) == nil {
            // Held elsewhere: by a live engine, or by one whose process is gone (a restart).
            guard try await releaseRunsOfDeadEngines() > 0, try await store.claim(runID: run.id, owner: id, until: leaseEnd) != nil else {
                notClaimed(run)
                return nil
            }
        }
        holdings.withLock { _ = $0.held.insert(run.id) }
        return try await store.history(runID: run.id)
    }

    @inline(never)
    private nonisolated func notClaimed(_ run: RunRecord) {
        runLogger(run).debug("run is held by another engine or no longer runs; not executing it")
    }

    @inline(never)
    private nonisolated func opened(_ run: RunRecord, definition: Flow, history: [HistoryEvent]) -> FlowRun {
        let replaying = history.count { $0.kind.isReplayed }
        notify(.executing(run: ref(run), replaying: replaying))
        if replaying > 0 {
            metrics.resumes.increment()
            runLogger(run).info("resuming run", metadata: ["hop.replaying": "\(replaying)"])
        }
        return FlowRun(run: run, definition: definition, history: history, engine: self, store: store)
    }

    /// Records that the body of `handle`'s run returned: the run is completed.
    @inline(never)
    private nonisolated func complete(_ handle: FlowRun) async throws {
        try handle.finish()
        try await record(run: handle, kind: .complete, name: nil) {
            try await self.store.completeRun(runID: handle.runID, owner: self.id)
        }
        completed(handle)
    }

    @inline(never)
    private nonisolated func completed(_ handle: FlowRun) {
        runLogger(handle).info("run completed")
    }

    /// Settles a run whose execution ended with `error`: parked, stopped, diverged or failed.
    @inline(never)
    private nonisolated func settle(_ run: RunRecord, after error: any Error, flowRun: FlowRun?) async {
        let logger = runLogger(run)
        if holdings.withLock({ $0.lost.contains(run.id) }) { return }  // said once, when it was lost
        switch error {
        case Suspension.parked(let step):
            logger.debug("run parked on an external step", metadata: ["hop.step": "\(step)"])
            // A step that waits for a stored change that had already come ended as it parked.
            if case .external(let external)? = self.step(named: step)?.kind, external.wakeOn != nil {
                await executeAgainIfWoken(run.id)
            }
        case Suspension.finished:
            logger.info("run was finished or taken over elsewhere; stopped executing it, writing nothing more")
        case _ where Task.isCancelled:
            logger.info("stopped executing run; it stays resumable")
            try? await store.release(runID: run.id, owner: id)
        case let error as HopEngineError where error.kind == .diverged:
            metrics.divergences.increment()
            logger.error("run diverged", metadata: ["hop.error": "\(error)"])
            if let flowRun {
                _ = try? await record(run: flowRun, kind: .diverge, name: nil) {
                    try await self.store.divergeRun(runID: run.id, step: nil, message: error.message, owner: self.id)
                }
            }
        case let error as HopEngineError where error.kind == .stepFailed:
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
        case let error as HopStoreError where error.isDatabaseFailure:
            // The database failed (busy, I/O): nothing was recorded, so the run stays resumable.
            logger.error("run stopped by a database error; it stays resumable", metadata: ["hop.error": "\(error)"])
            try? await store.release(runID: run.id, owner: id)
        default:
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
            if let current = try? await store.run(id: run.id), current.status.isUnfinished {
                _ = try? await store.recordError(runID: run.id, step: current.currentStep, message: "\(error)", final: true, owner: id)
            }
        }
    }

    /// The engine's logger with the run's metadata.
    nonisolated func runLogger(_ run: RunRecord) -> Logger {
        runLogger(runID: run.id, flow: run.flow, subject: run.subject)
    }

    nonisolated func runLogger(_ run: FlowRun) -> Logger {
        runLogger(runID: run.runID, flow: run.flow, subject: run.subject)
    }

    private nonisolated func runLogger(runID: Int64, flow: String, subject: String) -> Logger {
        var logger = self.logger
        logger[metadataKey: "hop.run"] = "\(runID)"
        logger[metadataKey: "hop.flow"] = "\(flow)"
        logger[metadataKey: "hop.subject"] = "\(subject)"
        return logger
    }

    /// Records the hop of `run` to `step`; an external step parks the run in the same transaction.
    @inline(never)
    nonisolated func recordHop(run: FlowRun, step: String, from: String?, deadline: Date?) async throws -> HistoryEvent {
        let (parks, wakeOn) = try hopKind(of: step, run: run)
        // Parking gives the run up: from its commit on, no engine holds it, which is no loss.
        if parks { holdings.withLock { _ = $0.held.remove(run.runID) } }
        let event = try await record(run: run, kind: .hop, name: step) {
            try await self.store.recordHop(
                runID: run.runID, step: step, from: from, parks: parks, wakeOn: wakeOn, deadline: deadline, owner: self.id)
        }
        metrics.hops.increment()
        return event
    }

    /// Whether a hop to `step` parks the run (an external step), and on what stored change it wakes.
    @inline(never)
    private nonisolated func hopKind(of step: String, run: FlowRun) throws -> (parks: Bool, wakeOn: WakeCondition?) {
        guard let registration = self.step(named: step) else {
            throw HopEngineError(
                .notRegistered,
                "run \(run.runID) of flow '\(run.flow)' hops to step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\") before starting the engine")
        }
        if case .external(let external) = registration.kind { return (true, external.wakeOn) }
        return (false, nil)
    }

    /// Enters `step` of `run`, whose hop is recorded with `token`, and returns how it ended.
    @inline(never)
    nonisolated func enter(step: String, token: String, deadline: Date?, run: FlowRun, isReentry: Bool) async throws -> StepOutput {
        let registration = try inProcessStep(step, of: run)
        var attempt = 1
        while true {
            let unhopper = Unhopper(engine: self, run: run, step: step, token: token)
            let started = ContinuousClock.now
            do {
                let finished = try await runStep(
                    registration.factory,
                    StepContext(
                        flow: run.flow, subject: run.subject, runID: run.runID, step: step, token: token, attempt: attempt,
                        isReentry: isReentry, store: store, unhopper: unhopper),
                    until: deadline)
                return try await stepReturned(finished, run: run, step: step, token: token, unhopper: unhopper, started: started)
            } catch {
                if let output = try await stepThrew(error, run: run, step: step, retry: registration.retry, attempt: attempt, unhopper: unhopper) {
                    return output
                }
            }
            attempt += 1
        }
    }

    /// The in-process step registered as `step`; parks the run on an external step.
    @inline(never)
    private nonisolated func inProcessStep(_ step: String, of run: FlowRun) throws -> (factory: @Sendable () -> any HopStep, retry: RetryPolicy) {
        guard let registration = self.step(named: step) else {
            throw HopEngineError(
                .notRegistered, "run \(run.runID) is in step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\")")
        }
        switch registration.kind {
        case .external:
            run.stop(Suspension.parked(step: step))
            throw Suspension.parked(step: step)
        case .inProcess(let make):
            return (make, registration.retry)
        }
    }

    /// The step's body returned (`finished`) or its deadline passed first: unhops it if the body
    /// did not, or records the timeout.
    @inline(never)
    private nonisolated func stepReturned(
        _ finished: Bool, run: FlowRun, step: String, token: String, unhopper: Unhopper, started: ContinuousClock.Instant
    ) async throws -> StepOutput {
        if !finished {
            if let output = try await timeOut(run: run, step: step, token: token, unhopper: unhopper) { return output }
            return StepOutput(json: nil, ending: .timedOut)
        }
        if !unhopper.result.unhopped { try await unhopper.unhop(output: nil) }
        metrics.stepDuration(step, ContinuousClock.now - started)
        return StepOutput(json: unhopper.result.output)
    }

    /// The step's body threw: returns its output when its unhop stands, `nil` to try again after
    /// the retry policy's backoff, or throws to stop or fail the run.
    @inline(never)
    private nonisolated func stepThrew(
        _ error: any Error, run: FlowRun, step: String, retry: RetryPolicy, attempt: Int, unhopper: Unhopper
    ) async throws -> StepOutput? {
        if Task.isCancelled { throw error }
        // The database failed (I/O, full disk, busy) while the step unhopped or read it:
        // that is no fault of the step's, so it is not retried or failed; the run stops
        // and stays resumable.
        if let failure = error as? HopStoreError, failure.isDatabaseFailure { throw failure }
        if let current = try await store.run(id: run.runID), !current.status.isUnfinished || current.owner != id {
            run.stop(Suspension.finished)
            throw Suspension.finished
        }
        if unhopper.result.unhopped {
            logger.warning(
                "step threw after it unhopped; the unhop stands",
                metadata: ["hop.run": "\(run.runID)", "hop.step": "\(step)", "hop.error": "\(error)"])
            return StepOutput(json: unhopper.result.output)
        }
        let final = attempt >= retry.maxAttempts
        let message = "attempt \(attempt) of \(retry.maxAttempts): \(error)"
        try await record(run: run, kind: final ? .fail : .error, name: step) {
            try await self.store.recordError(runID: run.runID, step: step, message: message, final: final, owner: self.id)
        }
        if final {
            throw HopEngineError(
                .stepFailed,
                "step '\(step)' of run \(run.runID) (flow '\(run.flow)', subject '\(run.subject)') failed after \(attempt) attempt(s): \(error). Start the run over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`")
        }
        try await Task.sleep(for: retry.backoff(afterAttempt: attempt))
        return nil
    }

    /// Runs a step's body; with a deadline, races it and returns `false` when the deadline came first
    /// (the body's task is then cancelled).
    @inline(never)
    private nonisolated func runStep(
        _ factory: @escaping @Sendable () -> any HopStep, _ context: StepContext, until deadline: Date?
    ) async throws -> Bool {
        guard let deadline else {
            try await factory().run(context)
            return true
        }
        return try await runStep(factory, context, racing: deadline)
    }

    @inline(never)
    private nonisolated func runStep(
        _ factory: @escaping @Sendable () -> any HopStep, _ context: StepContext, racing deadline: Date
    ) async throws -> Bool {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await factory().run(context)
                return true
            }
            group.addTask {
                let wait = deadline.timeIntervalSinceNow
                if wait > 0 { try await Task.sleep(for: FlowRun.sleepDuration(seconds: wait)) }
                return false
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { return true }
            return first
        }
    }

    /// Records that `step` timed out; if it unhopped in the meantime, returns its output instead.
    private nonisolated func timeOut(run: FlowRun, step: String, token: String, unhopper: Unhopper) async throws -> StepOutput? {
        if unhopper.result.unhopped { return StepOutput(json: unhopper.result.output) }
        do {
            try await record(run: run, kind: .timeout, name: step) {
                try await self.store.recordTimeout(runID: run.runID, token: token, owner: self.id)
            }
            return nil
        } catch let error as HopStoreError where error.kind == .refused && unhopper.result.unhopped {
            return StepOutput(json: unhopper.result.output)
        }
    }

    /// Commits one history entry through `commit`, telling the observer before and after.
    /// A refusal because another engine took the run over stops this execution.
    @discardableResult
    @inline(never)
    nonisolated func record(
        run: FlowRun, kind: HistoryKind, name: String?, _ commit: @Sendable () async throws -> HistoryEvent
    ) async throws -> HistoryEvent {
        willRecord(run: run, kind: kind, name: name)
        let event: HistoryEvent
        do {
            event = try await commit()
        } catch let error as HopStoreError where error.kind == .refused {
            try await stopIfFinishedElsewhere(run)
            throw error
        }
        didRecord(run: run, kind: kind, name: name, event: event)
        return event
    }

    @inline(never)
    private nonisolated func willRecord(run: FlowRun, kind: HistoryKind, name: String?) {
        notify(.willRecord(run: RunRef(id: run.runID, flow: run.flow, subject: run.subject), kind: kind, step: name))
    }

    @inline(never)
    private nonisolated func didRecord(run: FlowRun, kind: HistoryKind, name: String?, event: HistoryEvent) {
        notify(.recorded(run: RunRef(id: run.runID, flow: run.flow, subject: run.subject), event: event))
        logger.debug(
            "recorded \(kind.rawValue)",
            metadata: ["hop.run": "\(run.runID)", "hop.flow": "\(run.flow)", "hop.subject": "\(run.subject)", "hop.step": "\(name ?? "")"])
    }

    /// After a refused write: stops this execution when the run was finished or taken over elsewhere.
    @inline(never)
    private nonisolated func stopIfFinishedElsewhere(_ run: FlowRun) async throws {
        if let current = try await store.run(id: run.runID), !current.status.isUnfinished || current.owner != id {
            run.stop(Suspension.finished)
            throw Suspension.finished
        }
    }
}

/// A run's history read in bulk, handed to the run's task, which takes it out: the task's
/// closure does not keep it alive after the run's replay has let it go.
final class ClaimedHistory: Sendable {
    private let history: Mutex<[HistoryEvent]?>

    init(_ history: [HistoryEvent]) { self.history = Mutex(history) }

    func take() -> [HistoryEvent]? { history.withLock { $0.take() } }
}

/// Which runs an engine holds, shared by its executions and its watch without an actor hop.
struct Holdings: Sendable {
    /// Runs this engine claimed and is executing.
    var held: Set<Int64> = []
    /// Held runs that another engine took over (this one was frozen past its lease): their
    /// executions are cancelled and write nothing more.
    var lost: Set<Int64> = []

    /// Marks held run `runID` lost; `false` when it was not held or already marked.
    mutating func lose(_ runID: Int64) -> Bool {
        held.contains(runID) && lost.insert(runID).inserted
    }

    mutating func settled(_ runID: Int64) {
        held.remove(runID)
        lost.remove(runID)
    }
}
