#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Recording what a run does: hops, their ends, decisions, timers, effects and errors, one
/// write each or several together (``record(_:runID:owner:durability:)``). Each write is fenced
/// by the run's owner.
extension HopStore {
    // MARK: Recording what a run does

    /// Applies `writes` for run `runID` in order, as one write fenced by `owner` (the engine
    /// executing the run; `nil` for a write from outside): all of them or, when one is refused
    /// or fails, none. Returns the history entry each one appended.
    ///
    /// With `following`, refused unless the run's history ends at that entry (the last the
    /// engine executing the run saw; a file has no failover, but a write from outside, such as
    /// `engine.unhop` with a token, moves the history on without the engine).
    ///
    /// - Throws: `.invalidInput` for a bad name or JSON value; `.refused` when `owner` does not
    ///   hold the run, the run is finished, its history does not end at `following`, a hop finds
    ///   a step still in flight or an unhop's token is stale; nothing changed.
    package func record(
        _ writes: [RunWrite], runID: Int64, owner: String?, following: Int64?, durability: WriteDurability
    ) async throws -> [HistoryEntry] {
        for write in writes { try write.validate(path: path) }
        let operation =
            writes.count == 1 ? writes[0].operation(runID: runID) : "record \(writes.count) entries of run \(runID)"
        return try await write(durability, operation, runID: runID) { tx in
            if writes.count == 2, case .unhop(let token, let output) = writes[0], writes[1].needsRunningRun {
                return try tx.recordUnhop(
                    token: token, output: output, then: writes[1], runID: runID, owner: owner, following: following)
            }
            guard writes.count > 1 else {
                return try writes.map { try tx.record($0, runID: runID, owner: owner, following: following) }
            }
            // A later write may refuse after an earlier one changed the run: all or none. Only
            // the first follows the writer's last entry; each later one follows the one before.
            return try tx.atomically {
                try writes.enumerated().map { index, write in
                    try tx.record(write, runID: runID, owner: owner, following: index == 0 ? following : nil)
                }
            }
        }
    }

    /// Ends the step in flight of run `runID` because its deadline passed, exactly once
    /// (a racing unhop and timeout: the first to commit wins, the other is refused).
    @discardableResult
    package func recordTimeout(runID: Int64, token: String, owner: String? = nil) async throws -> HistoryEntry {
        let operation = "time out run \(runID)"
        return try await write(.now, operation, runID: runID) { tx in
            let run = try tx.requireUnfinished(runID, owner: owner, operation: operation)
            return try tx.endStep(run, token: token, kind: .timeout, value: nil, operation: operation)
        }
    }

    /// Finishes `step`, on which the unfinished run of `flow` for `subject` is parked (as
    /// `hopctl unhop` does), exactly once. Addressed by step, so a retried command never
    /// finishes another step after it; a flow that parks on the same step again is told from
    /// its first parking only by `runID` and `entry`.
    ///
    /// - Parameters:
    ///   - runID: the run meant: refused unless it is the subject's unfinished run of the flow.
    ///   - entry: with `runID`, the history entry of the hop that parked the run on `step` (see
    ///     ``stepEntries(runIDs:)``): refused, changing nothing, once that step has ended, even
    ///     when the run is parked on `step` again.
    /// - Throws: `.notFound` without an unfinished run, or when `runID` is no run of the flow for
    ///   `subject` or `entry` no hop of it to `step`; `.refused`, changing nothing, when the run
    ///   is not parked on `step` (or not by `entry`), or when `step` is finished by a stored
    ///   session (a login step); `.invalidInput` for an `entry` without `runID`.
    public func unhopParked(
        flow: String, subject: String, step: String, runID: Int64? = nil, entry: Int64? = nil, output: String? = nil
    ) async throws -> (run: RunRecord, unhop: HistoryEntry) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(step, as: "step name")
        let operation = "unhop \(step) of \(flow) for \(subject)"
        if let output { try JSONText.validate(output, as: "step output", path: path) }
        let rules = StorageRules(location: path)
        try rules.checkEntryNamesItsRun(entry: entry, runID: runID, operation: operation)
        return try await transaction(operation) { tx in
            let unfinished = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation)
            try tx.checkNamedRun(
                runID, current: unfinished, flow: flow, subject: subject, verb: "unhop", operation: operation)
            guard let run = unfinished else {
                throw tx.noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            if let entry {
                // Entry `entry` of the run: its step, kind and token; how the step it entered ended
                // (the entry that ended it, by its token); and the entry of the run's step in flight.
                let named = try tx.queryOne(
                    """
                    SELECT h.step, h.kind, h.token,
                        (SELECT e.kind FROM history e
                            WHERE e.run_id = h.run_id AND e.kind IN \(HistoryKind.stepEndsSQL) AND e.token = h.token),
                        (SELECT c.seq FROM runs r JOIN history c ON c.run_id = r.id AND c.token = r.current_token
                            WHERE r.id = h.run_id AND c.kind = 'hop')
                    FROM history h WHERE h.run_id = ?1 AND h.seq = ?2
                    """, [.integer(run.id), .integer(entry)], operation: operation
                ) { row in
                    (
                        hop: (step: row.optionalText(0), kind: row.text(1), token: row.optionalText(2)),
                        ending: row.optionalText(3), current: row.optionalInt64(4)
                    )
                }
                try rules.checkNamedEntry(
                    entry, of: run, step: step, hop: named?.hop, ending: named?.ending, current: named?.current,
                    operation: operation)
            }
            let token = try rules.tokenToUnhop(run, step: step, operation: operation)
            let event = try tx.endStep(RunHead(run), token: token, kind: .unhop, value: output, operation: operation)
            return (try tx.requireRun(run.id, operation: operation), event)
        }
    }

    /// Records that `step` threw. With `final`, the run is marked failed. With `following`,
    /// refused, changing nothing, unless the run's history ends at that entry.
    @discardableResult
    package func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        let operation = "record error of run \(runID)"
        return try await write(.now, operation, runID: runID) { tx in
            _ = try tx.requireUnfinished(runID, owner: owner, following: following, operation: operation)
            let event = try tx.append(
                runID: runID, final ? .fail : .error, step: step, value: message, operation: operation)
            if final { try tx.setStatus(runID, .failed, operation: operation) }
            return event
        }
    }
}

extension WriteTransaction {
    /// Applies one write of the engine's for run `runID`, fenced by `owner`.
    ///
    /// - Parameter checked: the run as a write earlier in this transaction left it, checked
    ///   running and held by `owner` (``recordUnhop(token:output:then:runID:owner:)``); read
    ///   and checked here when `nil`.
    /// - Parameter endsStep: the run's row still names a step that an unhop earlier in this
    ///   write ended without clearing it: this write's own update of the row clears it.
    /// - Parameter following: with no `checked` run, refused unless the run's history ends at
    ///   this entry (``StorageRules/checkFollows(runID:last:following:operation:)``).
    func record(
        _ write: RunWrite, runID: Int64, owner: String?, checked: RunHead? = nil, endsStep: Bool = false,
        following: Int64? = nil
    ) throws -> HistoryEntry {
        let operation = write.operation(runID: runID)
        switch write {
        case .hop(let step, let from, let parks, let wakeOn, let deadline):
            return try hop(
                runID: runID, step: step, from: from, parks: parks, wakeOn: wakeOn, deadline: deadline, owner: owner,
                checked: checked, following: following, operation: operation)
        case .unhop(let token, let output):
            let run = try checked ?? requireUnfinished(runID, owner: owner, following: following, operation: operation)
            return try endStep(run, token: token, kind: .unhop, value: output, operation: operation)
        case .decision(let name, let value):
            let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
            return try append(
                runID: runID, .decision, step: name, value: value, after: run.lastSeq, endsStep: endsStep,
                operation: operation)
        case .patch(let name):
            let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
            return try append(
                runID: runID, .patch, step: name, after: run.lastSeq, endsStep: endsStep, operation: operation)
        case .timer(let name, let deadline):
            let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
            return try append(
                runID: runID, .timer, step: name,
                value: HistoryEntry.deadlineValue(.timer, milliseconds: Clock.milliseconds(deadline)),
                deadline: deadline,
                after: run.lastSeq, endsStep: endsStep, operation: operation)
        case .markUsed(let feature):
            let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
            try self.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                [.text(run.subject), .text(feature), .integer(Clock.nowMilliseconds())], operation: operation)
            return try append(
                runID: runID, .effect, step: markUsedEffectName(feature), after: run.lastSeq, endsStep: endsStep,
                operation: operation)
        case .complete:
            let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
            // The status's update sets `updated_at` too.
            let event = try append(
                runID: runID, .complete, after: run.lastSeq, touchesRun: false, operation: operation)
            try setStatus(runID, .completed, endsStep: endsStep, operation: operation)
            return event
        }
    }

    /// A step's unhop and the run's next write (a hop, a decision, the completion…), as one
    /// write: the engine holds the unhop of a step that returned until the run writes next.
    /// The run is read and checked once, for both: running and held by `owner`. Once the unhop
    /// passed, the next write cannot refuse (the run is running, with no step in flight), so
    /// no savepoint is needed for all or none, and the run's row is updated once, by the next
    /// write, which also clears the ended step.
    func recordUnhop(
        token: String, output: String?, then next: RunWrite, runID: Int64, owner: String?, following: Int64?
    ) throws -> [HistoryEntry] {
        let operation = next.operation(runID: runID)
        let run = try requireRunning(runID, owner: owner, following: following, operation: operation)
        let unhop = try endStep(run, token: token, kind: .unhop, value: output, updatesRun: false, operation: operation)
        let entry = try record(
            next, runID: runID, owner: owner, checked: RunHead(run, endedAt: unhop.seq), endsStep: true)
        return [unhop, entry]
    }

    /// Records that run `runID` entered `step`, after an optional transition from `from`, with a
    /// fresh token. A parking step leaves the run `parked` and releases its lease; with a
    /// `deadline`, the step times out then (stored with the hop).
    private func hop(
        runID: Int64, step: String, from: String?, parks: Bool, wakeOn: WakeCondition?, deadline: Date?,
        owner: String?, checked: RunHead?, following: Int64?, operation: String
    ) throws -> HistoryEntry {
        let run = try checked ?? requireRunning(runID, owner: owner, following: following, operation: operation)
        if let inFlight = run.currentStep, run.currentToken != nil {
            throw refuse(.refused, operation, "step '\(inFlight)' is still in flight; it must unhop first")
        }
        var lastSeq = run.lastSeq
        if let from {
            lastSeq = try append(
                runID: runID, .transition, step: step, value: from, after: lastSeq, operation: operation
            ).seq
        }
        let token = Token.random()
        let deadlineValue = deadline.map { HistoryEntry.deadlineValue(.hop, milliseconds: Clock.milliseconds($0)) }
        let event = try append(
            runID: runID, .hop, step: step, token: token, value: deadlineValue, deadline: deadline, after: lastSeq,
            touchesRun: false, operation: operation)
        if parks {
            // Parked: held by no engine until an unhop, a change or its deadline wakes it. The
            // deadline by the uptime clock too: a step of the wall clock moves it no nearer.
            let clock = UptimeClock.machine
            let uptime = deadline.flatMap(clock.uptime(at:))
            try self.run(
                """
                UPDATE runs SET current_step = ?2, current_token = ?3, status = \(RunStatus.parked.sql), wake_on = ?4,
                    wake_at = ?5, wake_boot = ?7, wake_uptime = ?8, owner = NULL, lease_expires_at = NULL,
                    updated_at = ?6
                WHERE id = ?1
                """,
                [
                    .integer(runID), .text(step), .text(token), .optional(wakeOn?.rawValue),
                    .optional(deadline.map(Clock.milliseconds)), .integer(Clock.nowMilliseconds()),
                    .optional(uptime == nil ? nil : clock.boot), .optional(uptime),
                ],
                operation: operation)
            if let wakeOn { try endIfAlreadyWoken(runID: runID, wakeOn: wakeOn, operation: operation) }
        } else {
            // A running run stays running, held and unscheduled: only the step changes, so the
            // indexes on status, owner and wake-up time are not rewritten.
            try self.run(
                "UPDATE runs SET current_step = ?2, current_token = ?3, updated_at = ?4 WHERE id = ?1",
                [.integer(runID), .text(step), .text(token), .integer(Clock.nowMilliseconds())],
                operation: operation)
        }
        return event
    }

    /// A step that parks until a stored change, whose change has already happened when it parks,
    /// ends at once in the same transaction, as the change would have ended it: a login step
    /// entered after the session was stored (a login that raced the hop) is unhopped, a step that
    /// lasts while a session is stored is re-routed when none is. Otherwise it would wait for a
    /// change that already came.
    private func endIfAlreadyWoken(runID: Int64, wakeOn: WakeCondition, operation: String) throws {
        let subject = try requireRun(runID, operation: operation).subject
        let stored = try HopStore.session(subject: subject, on: connection, operation: operation)
        switch (wakeOn, stored) {
        case (.sessionStored, let stored?):
            try unhopLoginSteps(subject: subject, userID: stored.userID, operation: operation)
        case (.sessionRemoved, nil):
            try rerouteSessionSteps(subject: subject, reason: "session-removed", operation: operation)
        default:
            break
        }
    }
}
