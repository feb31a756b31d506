import Foundation
import HopStore
import Logging

extension HopEngine {
    /// Executes `run` in a task of its own, unless this engine is executing it already
    /// (then it executes once more as soon as the current execution settles).
    func execute(_ run: RunRecord) {
        guard executing[run.id] == nil else {
            executeAgain.insert(run.id)
            return
        }
        guard let definition = flow(named: run.flow) else {
            logger.warning("a run of an unregistered flow is not executed", metadata: metadata(run))
            return
        }
        executing[run.id] = Task { [self] in
            await self.perform(run, definition: definition)
            await self.didSettle(run.id)
        }
    }

    private func didSettle(_ runID: Int64) async {
        executing[runID] = nil
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

    /// Runs the flow body against the run's history until it completes, parks, fails or is stopped.
    private nonisolated func perform(_ run: RunRecord, definition: Flow) async {
        var logger = self.logger
        logger[metadataKey: "hop.run"] = "\(run.id)"
        logger[metadataKey: "hop.flow"] = "\(run.flow)"
        logger[metadataKey: "hop.subject"] = "\(run.subject)"
        var flowRun: FlowRun?
        do {
            guard try await store.claim(runID: run.id, owner: id, until: leaseEnd) != nil else {
                logger.debug("run is held by another engine or no longer runs; not executing it")
                return
            }
            let history = try await store.history(runID: run.id)
            let replaying = history.filter(\.kind.isReplayed).count
            notify(.executing(run: ref(run), replaying: replaying))
            if replaying > 0 {
                metrics.resumes.increment()
                logger.info("resuming run", metadata: ["hop.replaying": "\(replaying)"])
            }
            let handle = FlowRun(run: run, definition: definition, history: history, engine: self, store: store)
            flowRun = handle
            try await definition.body(handle)
            try handle.finish()
            try await record(run: handle, kind: .complete, name: nil) {
                try await self.store.completeRun(runID: run.id, owner: self.id)
            }
            logger.info("run completed")
        } catch Suspension.parked(let step) {
            logger.debug("run parked on an external step", metadata: ["hop.step": "\(step)"])
        } catch Suspension.finished {
            logger.info("run was finished or taken over elsewhere; stopped executing it")
        } catch where Task.isCancelled {
            logger.info("stopped executing run; it stays resumable")
            try? await store.release(runID: run.id, owner: id)
        } catch let error as HopEngineError where error.kind == .diverged {
            metrics.divergences.increment()
            logger.error("run diverged", metadata: ["hop.error": "\(error)"])
            if let flowRun {
                _ = try? await record(run: flowRun, kind: .diverge, name: nil) {
                    try await self.store.divergeRun(runID: run.id, step: nil, message: error.message, owner: self.id)
                }
            }
        } catch let error as HopEngineError where error.kind == .stepFailed {
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
        } catch let error as HopStoreError where error.isDatabaseFailure {
            // The database failed (busy, I/O): nothing was recorded, so the run stays resumable.
            logger.error("run stopped by a database error; it stays resumable", metadata: ["hop.error": "\(error)"])
            try? await store.release(runID: run.id, owner: id)
        } catch {
            logger.error("run failed", metadata: ["hop.error": "\(error)"])
            if let current = try? await store.run(id: run.id), current.status.isUnfinished {
                _ = try? await store.recordError(runID: run.id, step: current.currentStep, message: "\(error)", final: true, owner: id)
            }
        }
    }

    /// Records the hop of `run` to `step`; an external step parks the run in the same transaction.
    nonisolated func recordHop(run: FlowRun, step: String, from: String?, deadline: Date?) async throws -> HistoryEvent {
        guard let registration = self.step(named: step) else {
            throw HopEngineError(
                .notRegistered,
                "run \(run.runID) of flow '\(run.flow)' hops to step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\") before starting the engine")
        }
        let (parks, wakeOn): (Bool, WakeCondition?) =
            if case .external(let external) = registration.kind { (true, external.wakeOn) } else { (false, nil) }
        let event = try await record(run: run, kind: .hop, name: step) {
            try await self.store.recordHop(
                runID: run.runID, step: step, from: from, parks: parks, wakeOn: wakeOn, deadline: deadline, owner: self.id)
        }
        metrics.hops.increment()
        return event
    }

    /// Enters `step` of `run`, whose hop is recorded with `token`, and returns how it ended.
    nonisolated func enter(step: String, token: String, deadline: Date?, run: FlowRun, isReentry: Bool) async throws -> StepOutput {
        guard let registration = self.step(named: step) else {
            throw HopEngineError(
                .notRegistered, "run \(run.runID) is in step '\(step)', but no step is registered under that name: register it with engine.register(step: \"\(step)\")")
        }
        let factory: @Sendable () -> any HopStep
        switch registration.kind {
        case .external:
            run.stop(Suspension.parked(step: step))
            throw Suspension.parked(step: step)
        case .inProcess(let make):
            factory = make
        }
        var attempt = 1
        while true {
            let started = ContinuousClock.now
            let unhopper = Unhopper(engine: self, run: run, step: step, token: token)
            let context = StepContext(
                flow: run.flow, subject: run.subject, runID: run.runID, step: step, token: token, attempt: attempt,
                isReentry: isReentry, store: store, unhopper: unhopper)
            do {
                let finished = try await runStep(factory, context, until: deadline)
                if !finished {
                    if let output = try await timeOut(run: run, step: step, token: token, unhopper: unhopper) { return output }
                    return StepOutput(json: nil, ending: .timedOut)
                }
                if !unhopper.result.unhopped { try await unhopper.unhop(output: nil) }
                metrics.stepDuration(step, ContinuousClock.now - started)
                return StepOutput(json: unhopper.result.output)
            } catch {
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
                let final = attempt >= registration.retry.maxAttempts
                let message = "attempt \(attempt) of \(registration.retry.maxAttempts): \(error)"
                try await record(run: run, kind: final ? .fail : .error, name: step) {
                    try await self.store.recordError(runID: run.runID, step: step, message: message, final: final, owner: self.id)
                }
                if final {
                    throw HopEngineError(
                        .stepFailed,
                        "step '\(step)' of run \(run.runID) (flow '\(run.flow)', subject '\(run.subject)') failed after \(attempt) attempt(s): \(error). Start the run over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`")
                }
                try await Task.sleep(for: registration.retry.backoff(afterAttempt: attempt))
                attempt += 1
            }
        }
    }

    /// Runs a step's body; with a deadline, races it and returns `false` when the deadline came first
    /// (the body's task is then cancelled).
    private nonisolated func runStep(
        _ factory: @escaping @Sendable () -> any HopStep, _ context: StepContext, until deadline: Date?
    ) async throws -> Bool {
        guard let deadline else {
            try await factory().run(context)
            return true
        }
        return try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await factory().run(context)
                return true
            }
            group.addTask {
                let wait = deadline.timeIntervalSinceNow
                if wait > 0 { try await Task.sleep(for: .milliseconds(Int64(wait * 1000))) }
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
    nonisolated func record(
        run: FlowRun, kind: HistoryKind, name: String?, _ commit: @Sendable () async throws -> HistoryEvent
    ) async throws -> HistoryEvent {
        let reference = RunRef(id: run.runID, flow: run.flow, subject: run.subject)
        notify(.willRecord(run: reference, kind: kind, step: name))
        let event: HistoryEvent
        do {
            event = try await commit()
        } catch let error as HopStoreError where error.kind == .refused {
            if let current = try await store.run(id: run.runID), !current.status.isUnfinished || (current.owner != nil && current.owner != id) {
                run.stop(Suspension.finished)
                throw Suspension.finished
            }
            throw error
        }
        notify(.recorded(run: reference, event: event))
        logger.debug(
            "recorded \(kind.rawValue)",
            metadata: ["hop.run": "\(run.runID)", "hop.flow": "\(run.flow)", "hop.subject": "\(run.subject)", "hop.step": "\(name ?? "")"])
        return event
    }
}
