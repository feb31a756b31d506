import HopStore
import Synchronization

/// A step's unhop — its own `unhop()`, or its return without one — held by its run's executor
/// until the run's next record, which writes both as one: one trip to the store, one check of
/// the run, one update of its row (``HopStorage/record(_:runID:owner:durability:)`` with the
/// unhop first). An unhop is coalesced (not durable before the next durable write) either way,
/// so a crash loses nothing that was durable: the step runs again, as for a crash before its
/// unhop.
///
/// Nothing stays held long: every path on which the run waits (a durable sleep, a request to
/// make its records durable) or ends (stopped, failed, diverged) writes it first, and
/// ``HeldUnhops`` writes the unhop of a run that did not record again within
/// ``HeldUnhops/limit`` (a flow body that awaits something else between two steps).
enum HeldUnhop: Sendable {
    case none
    /// Held: the step's end, with its name, its hop's token and its output.
    case held(StepUnhop)
    /// Being written alone: the run's next record waits for it.
    case writing(Task<Void, Never>)
}

/// The runs of one engine whose executor holds an unhop, and the sweep that writes the ones
/// held longer than ``limit``: it runs while any is held, every `limit`.
final class HeldUnhops: Sendable {
    /// How long an unhop stays held before it is written alone: the store's commit delay for
    /// coalesced writes (2 ms), so that a step's end is durable within a few milliseconds
    /// whatever the flow body does next.
    let limit: Duration

    init(limit: Duration) { self.limit = limit }

    private struct State {
        var held: [Int64: (executor: RunExecutor, since: ContinuousClock.Instant)] = [:]
        var sweeping = false
    }
    private let state = Mutex(State())

    /// Counts `executor`'s run among those holding an unhop.
    func hold(_ executor: RunExecutor) {
        let startSweep = state.withLock { state in
            state.held[executor.run.id] = (executor, .now)
            guard !state.sweeping else { return false }
            state.sweeping = true
            return true
        }
        if startSweep { Task { await self.sweep() } }
    }

    /// The run's unhop was taken: written with its next record, alone, or dropped.
    func release(_ runID: Int64) {
        _ = state.withLock { $0.held.removeValue(forKey: runID) }
    }

    /// Writes every held unhop, each alone, and returns once they are written.
    func writeAll() async {
        let executors = state.withLock { state in
            defer { state.held.removeAll() }
            return state.held.values.map(\.executor)
        }
        await withTaskGroup(of: Void.self) { group in
            for executor in executors { group.addTask { try? await executor.writeHeldUnhop() } }
        }
    }

    private func sweep() async {
        while true {
            try? await Task.sleep(for: limit)
            let (due, done) = state.withLock { state -> ([RunExecutor], Bool) in
                let cutoff = ContinuousClock.now.advanced(by: .zero - limit)
                let due = state.held.values.filter { $0.since <= cutoff }.map(\.executor)
                for executor in due { state.held[executor.run.id] = nil }
                if state.held.isEmpty { state.sweeping = false }
                return (due, !state.sweeping)
            }
            for executor in due { Task { try? await executor.writeHeldUnhop() } }
            if done { return }
        }
    }
}

extension RunExecutor {
    /// Holds the unhop of a step that unhopped, or returned: the run's next record writes it.
    func holdUnhop(_ unhop: StepUnhop) {
        held.withLock { $0 = .held(unhop) }
        environment.heldUnhops.hold(self)
    }

    /// Takes the held unhop, if any, for the caller to write with its record; waits while it
    /// is being written alone. Throws why this execution stopped, if it did: no record follows
    /// an unhop whose write failed, or a run finished elsewhere.
    func takeHeldUnhop() async throws -> StepUnhop? {
        while true {
            try throwIfStopped()
            let (taken, writing) = held.withLock { state -> (StepUnhop?, Task<Void, Never>?) in
                switch state {
                case .none: return (nil, nil)
                case .held(let unhop):
                    state = .none
                    return (unhop, nil)
                case .writing(let task): return (nil, task)
                }
            }
            if let writing {
                // Written alone, the unhop may have found the step ended from outside, or the
                // database failed: then this execution stopped, and writes nothing more.
                await writing.value
                continue
            }
            if taken != nil { environment.heldUnhops.release(run.id) }
            return taken
        }
    }

    /// Puts an unhop back that a failed record took: nothing of that record was written.
    func restoreHeldUnhop(_ unhop: StepUnhop) {
        let restored = held.withLock { state in
            guard case .none = state else { return false }
            state = .held(unhop)
            return true
        }
        if restored { environment.heldUnhops.hold(self) }
    }

    /// Writes the held unhop alone, if one is held, and returns once it is written; throws when
    /// it could not be, which stops the execution (a refusal: the step was ended from outside,
    /// or the run finished elsewhere; a failed write: the database failed).
    func writeHeldUnhop() async throws {
        let writing = held.withLock { state -> Task<Void, Never>? in
            switch state {
            case .none: return nil
            case .writing(let task): return task
            case .held(let unhop):
                let task = Task {
                    do {
                        try await self.record(.unhop, unhop.step) { storage, runID, owner in
                            try await storage.recordUnhop(
                                runID: runID, token: unhop.token, output: unhop.output, owner: owner,
                                following: self.following, durability: .coalesced)
                        }
                        self.environment.metrics.unhops.increment()
                    } catch let error as HopError where error.code == .refused {
                        unhop.writeFailed(error)
                        try? await self.stopIfStepEndedElsewhere(step: unhop.step, token: unhop.token)
                        try? await self.stopIfHistoryMoved()  // only if the step was not ended elsewhere
                    } catch Suspension.finished {
                        // Refused because the run was finished or taken over elsewhere: this
                        // execution stopped. A step's makeDurable() says so in the step's terms.
                        unhop.writeFailed(
                            HopError(
                                .refused,
                                "the unhop of step '\(unhop.step)' of run \(self.run.id) was refused: the run was finished (cancelled, restarted) or taken over elsewhere before the unhop was written"
                            ))
                    } catch {
                        // The database failed (nothing of the write stands, or it was lost with
                        // its transaction): this execution stops, before the run's next record
                        // could be written without the step's end, and the run goes on from its
                        // durable history, where the step is still in flight (it runs again).
                        unhop.writeFailed(error)
                        self.stop(error)
                    }
                    self.held.withLock { $0 = .none }
                }
                state = .writing(task)
                return task
            }
        }
        environment.heldUnhops.release(run.id)
        guard let writing else { return }
        await writing.value
        try throwIfStopped()
    }

    /// When `step`, which returned here (hopped with `token`), was ended from outside before
    /// its unhop was written (`engine.unhop` with its token), stops this execution: the run is
    /// executed again from its history, which holds that end and its output.
    func stopIfStepEndedElsewhere(step: String, token: String) async throws {
        try stopIfStepEndedElsewhere(step: step, token: token, as: try await storage.run(id: run.id))
    }

    /// ``stopIfStepEndedElsewhere(step:token:)`` for the run as the caller has just read it (`current`).
    func stopIfStepEndedElsewhere(step: String, token: String, as current: RunRecord?) throws {
        guard let current, current.status.isUnfinished, current.currentToken != token else { return }
        dropHeldUnhop()
        stop(Suspension.endedElsewhere(step: step))
        throw Suspension.endedElsewhere(step: step)
    }

    /// Forgets the held unhop: the execution ends without writing more (the run was finished
    /// or taken over elsewhere, or the database failed). The step runs again on resume.
    func dropHeldUnhop() {
        held.withLock { state in
            if case .held = state { state = .none }
        }
        environment.heldUnhops.release(run.id)
    }

    /// Records `write` for the run; with the held unhop before it, in one write, when one is
    /// held. `step` names the step of an unhop, for the observer (the write does not carry it).
    @discardableResult
    func record(_ write: RunWrite, step name: String? = nil, durability: WriteDurability) async throws -> HistoryEntry {
        let (kind, name) = (write.kind, name ?? write.name)
        guard let unhop = try await takeHeldUnhop() else {
            let following = following
            return try await record(kind, name) { storage, runID, owner in
                try await storage.record(
                    write, runID: runID, owner: owner, following: following, durability: durability)
            }
        }
        let ref = environment.ref(run)
        environment.notify(.willRecord(run: ref, kind: .unhop, step: unhop.step))
        environment.notify(.willRecord(run: ref, kind: kind, step: name))
        let entries: [HistoryEntry]
        do {
            entries = try await storage.record(
                [.unhop(token: unhop.token, output: unhop.output), write], runID: run.id, owner: environment.owner,
                following: following, durability: durability)
        } catch {
            // Nothing of it was written: the unhop waits for the run's next record, unless the
            // run was finished or taken over elsewhere (then this execution stops), or the step
            // was ended from outside meanwhile (`engine.unhop` with its token): then the run is
            // executed again from its history, which holds that end and its output.
            restoreHeldUnhop(unhop)
            if let refusal = error as? HopError, refusal.code == .refused {
                let current = try await storage.run(id: run.id)  // one read for both questions
                try stopIfFinishedElsewhere(as: current)
                try stopIfStepEndedElsewhere(step: unhop.step, token: unhop.token, as: current)
                try await stopIfHistoryMoved()
            }
            throw error
        }
        environment.metrics.unhops.increment()
        for entry in entries { recorded(entry) }
        guard let entry = entries.last, entries.count == 2 else {
            throw HopError(
                .sqlite, operation: write.operation(runID: run.id), path: storage.location,
                reason: "the store wrote \(entries.count) history entries for an unhop and the write after it, not 2")
        }
        return entry
    }
}
