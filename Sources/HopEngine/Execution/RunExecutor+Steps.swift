import Foundation
import Logging
import Tracing

/// Entering a step: an in-process step's body runs (with its retry policy and deadline) until
/// it unhops, times out or fails; an external step parks the run.
extension RunExecutor {
    /// Enters `step`, whose hop is recorded with `token`, and returns how it ended, in a span
    /// of its own (the step's body runs in its context). `deadlineByTheWallClock`: the deadline
    /// was read from a hop that says so (``HistoryEntry/deadlineGoesByTheWallClock``).
    @inline(never)
    func enter(
        step: String, token: String, deadline: Date?, deadlineByTheWallClock: Bool = false, isReentry: Bool
    ) async throws -> StepOutput {
        let span = startStepSpan(step, isReentry: isReentry)
        defer { span.end() }
        do {
            let output = try await InstrumentationContext.$current.withValue(span.context) {
                try await enter(
                    step: step, token: token, deadline: deadline.map { ($0, deadlineByTheWallClock) },
                    isReentry: isReentry, span: span)
            }
            Self.outcome(of: span, endedWith: output)
            return output
        } catch {
            Self.outcome(of: span, endedBy: error)
            throw error
        }
    }

    @inline(never)
    private func enter(
        step: String, token: String, deadline: (Date, byTheWallClock: Bool)?, isReentry: Bool, span: any Span
    ) async throws -> StepOutput {
        let registration = try inProcessStep(step)
        var attempt = 1
        while true {
            // Stopped before the body began (the engine stops, or the run was lost: its lease
            // lapsed, another engine took it over, it ended elsewhere): the body is not entered.
            // A body already cancelled could ignore it and run beside the engine that takes over.
            if Task.isCancelled { throw CancellationError() }
            span.setAttribute(SpanKey.attempts, attempt)
            let unhop = StepUnhop(executor: self, step: step, token: token)
            let started = ContinuousClock.now
            let finished: Bool
            do {
                finished = try await runStep(
                    registration.factory,
                    StepContext(
                        flow: run.flow, subject: run.subject, runID: run.id, step: step, token: token, attempt: attempt,
                        isReentry: isReentry, storage: storage, unhop: unhop),
                    until: deadline)
            } catch {
                if let output = try await stepThrew(
                    error, step: step, token: token, retry: registration.retry, attempt: attempt, unhop: unhop,
                    span: span)
                {
                    return output
                }
                attempt += 1
                continue
            }
            // What follows the body's return (its timeout recorded, the execution found stopped)
            // is the engine's, not a failure of the step's to retry.
            return try await stepReturned(finished, step: step, token: token, unhop: unhop, started: started)
        }
    }

    /// The in-process step registered as `step`; parks the run on an external step.
    @inline(never)
    private func inProcessStep(_ step: String) throws -> (factory: @Sendable () -> any HopStep, retry: RetryPolicy) {
        guard let registration = environment.step(named: step) else {
            throw HopError(
                .notRegistered,
                "run \(run.id) is in step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\")"
            )
        }
        switch registration.kind {
        case .external:
            stop(Suspension.parked(step: step))
            throw Suspension.parked(step: step)
        case .inProcess(let make):
            return (make, registration.retry)
        }
    }

    /// The step's body returned (`finished`) or its deadline passed first: unhops it if the body
    /// did not, or records the timeout.
    @inline(never)
    private func stepReturned(
        _ finished: Bool, step: String, token: String, unhop: StepUnhop, started: ContinuousClock.Instant
    ) async throws -> StepOutput {
        if !finished {
            if let output = try await timeOut(step: step, token: token, unhop: unhop) { return output }
            return StepOutput(json: nil, ending: .timedOut)
        }
        // Ended by returning: unhopped, unless it unhopped itself; either way the unhop goes
        // with the run's next record.
        unhop.returned()
        environment.metrics.stepDuration(step, ContinuousClock.now - started)
        // Stopped while the step ran (its unhop, written early, found it ended from outside;
        // the run was finished or taken over elsewhere): the body gets no output to go on with.
        try throwIfStopped()
        return StepOutput(json: unhop.output)
    }

    /// The step's body threw: returns its output when its unhop stands, `nil` to try again after
    /// the retry policy's backoff, or throws to stop or fail the run.
    @inline(never)
    private func stepThrew(
        _ error: any Error, step: String, token: String, retry: RetryPolicy, attempt: Int, unhop: StepUnhop,
        span: any Span
    ) async throws -> StepOutput? {
        let unhopped = unhop.end()  // from here on, an unhop of this attempt is refused
        if Task.isCancelled { throw error }
        // The database failed (I/O, full disk, busy) while the step unhopped or read it:
        // that is no fault of the step's, so it is not retried or failed; the run stops
        // and stays resumable.
        if let failure = error as? HopError, failure.isDatabaseFailure { throw failure }
        let current = try await storage.run(id: run.id)  // one read for both questions below
        try stopIfFinishedElsewhere(as: current)
        if unhopped {
            try throwIfStopped()
            environment.logger.warning(
                "step threw after it unhopped; the unhop stands",
                metadata: ["hop.run": "\(run.id)", "hop.step": "\(step)", "hop.error": "\(error)"])
            return StepOutput(json: unhop.output)
        }
        // Ended from outside while it ran (`engine.unhop` with its token): not a failure of the
        // step's; the run goes on from its history.
        try stopIfStepEndedElsewhere(step: step, token: token, as: current)
        let final = attempt >= retry.maxAttempts
        // Each failed attempt is on the step's span; the last one fails it (see `enter`).
        if !final { span.recordError(error, attributes: [SpanKey.attempts: .int64(Int64(attempt))]) }
        let message = "attempt \(attempt) of \(retry.maxAttempts): \(error)"
        let following = following
        try await record(final ? .fail : .error, step) { storage, runID, owner in
            try await storage.recordError(
                runID: runID, step: step, message: message, final: final, owner: owner, following: following)
        }
        if final {
            throw HopError(
                .stepFailed,
                "step '\(step)' of run \(run.id) (flow '\(run.flow)', subject '\(run.subject)') failed after \(attempt) attempt(s): \(error). Start the run over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`"
            )
        }
        try await Task.sleep(for: retry.backoff(afterAttempt: attempt))
        return nil
    }

    /// Runs a step's body; with a deadline, races it and returns `false` when the deadline came
    /// first (the body's task is then cancelled).
    @inline(never)
    private func runStep(
        _ factory: @escaping @Sendable () -> any HopStep, _ context: StepContext,
        until deadline: (Date, byTheWallClock: Bool)?
    ) async throws -> Bool {
        guard let deadline else {
            try await onThePool { try await factory().run(context) }
            return true
        }
        return try await runStep(factory, context, racing: deadline.0, byTheWallClock: deadline.byTheWallClock)
    }

    @inline(never)
    private func runStep(
        _ factory: @escaping @Sendable () -> any HopStep, _ context: StepContext, racing deadline: Date,
        byTheWallClock: Bool
    ) async throws -> Bool {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask(executorPreference: poolPreference) {
                try await factory().run(context)
                return true
            }
            group.addTask {
                try await self.wait(until: deadline, byTheWallClock: byTheWallClock)
                return false
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { return true }
            return first
        }
    }

    /// Records that `step` timed out; if it unhopped in the meantime, returns its output instead.
    private func timeOut(step: String, token: String, unhop: StepUnhop) async throws -> StepOutput? {
        if unhop.end() { return StepOutput(json: unhop.output) }  // a later unhop is refused
        try await record(.timeout, step) { storage, runID, owner in
            try await storage.recordTimeout(runID: runID, token: token, owner: owner)
        }
        return nil
    }
}
