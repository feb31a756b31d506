#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Recording what a run does, one history entry per transaction: hops, their ends, decisions,
/// timers, effects and errors. Each write is fenced by the run's owner.
extension HopStore {
    // MARK: Recording what a run does

    /// Records that run `runID` entered `step`, after an optional transition from `from`, and
    /// returns the hop entry with its fresh token. A parking step leaves the run `parked` and
    /// releases its lease; with a `deadline`, the step times out then (stored with the hop).
    ///
    /// - Parameter owner: the engine executing the run; the hop is refused when another engine holds it.
    @discardableResult
    package func recordHop(
        runID: Int64, step: String, from: String? = nil, parks: Bool = false, wakeOn: WakeCondition? = nil,
        deadline: Date? = nil, owner: String? = nil
    ) async throws -> HistoryEntry {
        try validate(step, as: "step name")
        let operation = "hop run \(runID) to \(step)"
        return try await write(.now, operation, runID: runID) { tx in
            let run = try tx.requireRunning(runID, owner: owner, operation: operation)
            if let inFlight = run.currentStep, run.currentToken != nil {
                throw tx.refuse(.refused, operation, "step '\(inFlight)' is still in flight; it must unhop first")
            }
            if let from {
                try tx.append(runID: runID, .transition, step: step, value: from, operation: operation)
            }
            let token = Token.random()
            let deadlineValue = deadline.map { #"{"deadline":\#(Clock.milliseconds($0))}"# }
            let event = try tx.append(
                runID: runID, .hop, step: step, token: token, value: deadlineValue, touchesRun: false,
                operation: operation)
            try tx.run(
                """
                UPDATE runs SET current_step = ?2, current_token = ?3, status = ?4, wake_on = ?5, wake_at = ?6,
                    owner = CASE WHEN ?7 THEN NULL ELSE owner END,
                    lease_expires_at = CASE WHEN ?7 THEN NULL ELSE lease_expires_at END,
                    updated_at = ?8
                WHERE id = ?1
                """,
                [
                    .integer(runID), .text(step), .text(token),
                    .text(parks ? RunStatus.parked.rawValue : RunStatus.running.rawValue),
                    .optional(parks ? wakeOn?.rawValue : nil),
                    .optional(parks ? deadline.map(Clock.milliseconds) : nil),
                    .integer(parks ? 1 : 0), .integer(Clock.nowMilliseconds()),
                ],
                operation: operation)
            if parks, let wakeOn { try tx.endIfAlreadyWoken(runID: runID, wakeOn: wakeOn, operation: operation) }
            return event
        }
    }

    /// Finishes the step in flight of run `runID`, exactly once.
    ///
    /// - Parameters:
    ///   - output: the step's output as JSON text, or `nil`.
    ///   - owner: the engine executing the run (for an in-process step); `nil` for an unhop from outside.
    /// - Throws: `.refused`, changing nothing, when the token is stale or unknown, the step
    ///   already unhopped, or the run is finished; `.invalidInput` when `output` is not JSON.
    @discardableResult
    package func recordUnhop(
        runID: Int64, token: String, output: String? = nil, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        let operation = "unhop run \(runID)"
        if let output { try JSONText.validate(output, as: "step output", path: path) }
        return try await write(durability, operation, runID: runID) { tx in
            let run = try tx.requireUnfinished(runID, owner: owner, operation: operation)
            return try tx.endStep(run, token: token, kind: .unhop, value: output, operation: operation)
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
    /// finishes the step after it.
    /// - Throws: `.notFound` without an unfinished run; `.refused`, changing nothing, when the run
    ///   is not parked on `step`, or when `step` is finished by a stored session (a login step).
    public func unhopParked(
        flow: String, subject: String, step: String, output: String? = nil
    ) async throws -> (run: RunRecord, unhop: HistoryEntry) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(step, as: "step name")
        let operation = "unhop \(step) of \(flow) for \(subject)"
        if let output { try JSONText.validate(output, as: "step output", path: path) }
        return try await transaction(operation) { tx in
            guard let run = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation) else {
                throw tx.noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            guard run.status == .parked, run.currentStep == step, let token = run.currentToken else {
                let now: String
                switch (run.status, run.currentStep) {
                case (.parked, let parked?): now = "it is parked on '\(parked)'"
                case (_, let inFlight?): now = "its step '\(inFlight)' is executing in the daemon and unhops itself"
                case (_, nil): now = "it has no step in flight"
                }
                throw tx.refuse(
                    .refused, operation, "run \(run.id) is not parked on '\(step)': \(now); nothing was changed",
                    hint: "Check `hopctl status --flow \(flow) --subject \(subject)`")
            }
            if run.wakeOn == .sessionStored {
                throw tx.refuse(
                    .refused, operation,
                    "step '\(step)' of run \(run.id) finishes when a session is stored, not by hand; nothing was changed",
                    hint: "Log the user in: `hopctl session login USER --subject \(subject)`")
            }
            let event = try tx.endStep(RunHead(run), token: token, kind: .unhop, value: output, operation: operation)
            return (try tx.requireRun(run.id, operation: operation), event)
        }
    }

    /// Records the value a condition had when the run read it; replay returns it again.
    @discardableResult
    package func recordDecision(
        runID: Int64, name: String, value: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try validate(name, as: "decision name")
        try JSONText.validate(value, as: "decision value", path: path)
        return try await appendToRunning(
            runID: runID, .decision, name: name, value: value, owner: owner, durability: durability,
            operation: "record decision \(name) of run \(runID)")
    }

    /// Records that run `runID` took the new branch of patch `name`; replay takes it again.
    @discardableResult
    package func recordPatch(
        runID: Int64, name: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try validate(name, as: "patch name")
        return try await appendToRunning(
            runID: runID, .patch, name: name, value: nil, owner: owner, durability: durability,
            operation: "record patch \(name) of run \(runID)")
    }

    /// Records a durable sleep of run `runID` until `deadline`; replay sleeps until the same deadline.
    @discardableResult
    package func recordTimer(
        runID: Int64, name: String, deadline: Date, owner: String? = nil
    ) async throws -> HistoryEntry {
        try validate(name, as: "timer name")
        return try await appendToRunning(
            runID: runID, .timer, name: name, value: "\(Clock.milliseconds(deadline))", owner: owner,
            durability: .now, operation: "record timer \(name) of run \(runID)")
    }

    /// Appends one entry named `name` to the history of run `runID`, which must be running and
    /// held by `owner`: what a decision, a patch marker and a timer each record.
    private func appendToRunning(
        runID: Int64, _ kind: HistoryKind, name: String, value: String?, owner: String?,
        durability: WriteDurability, operation: String
    ) async throws -> HistoryEntry {
        try await write(durability, operation, runID: runID) { tx in
            _ = try tx.requireRunning(runID, owner: owner, operation: operation)
            return try tx.append(runID: runID, kind, step: name, value: value, operation: operation)
        }
    }

    /// Marks `feature` used by the run's subject and records it in the run's history, in one transaction.
    @discardableResult
    package func markUsed(
        runID: Int64, feature: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try validate(feature, as: "feature name")
        let operation = "mark \(feature) used by run \(runID)"
        return try await write(durability, operation, runID: runID) { tx in
            let run = try tx.requireRunning(runID, owner: owner, operation: operation)
            try tx.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                [.text(run.subject), .text(feature), .integer(Clock.nowMilliseconds())], operation: operation)
            return try tx.append(runID: runID, .effect, step: markUsedEffectName(feature), operation: operation)
        }
    }

    /// The history name of the effect that marks `feature` used.

    /// Records that `step` threw. With `final`, the run is marked failed.
    @discardableResult
    package func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String? = nil
    ) async throws -> HistoryEntry {
        let operation = "record error of run \(runID)"
        return try await write(.now, operation, runID: runID) { tx in
            _ = try tx.requireUnfinished(runID, owner: owner, operation: operation)
            let event = try tx.append(
                runID: runID, final ? .fail : .error, step: step, value: message, operation: operation)
            if final { try tx.setStatus(runID, .failed, operation: operation) }
            return event
        }
    }
}

extension WriteTransaction {
    /// A step that parks until a stored change, whose change has already happened when it parks,
    /// ends at once in the same transaction, as the change would have ended it: a login step
    /// entered after the session was stored (a login that raced the hop) is unhopped, a step that
    /// lasts while a session is stored is re-routed when none is. Otherwise it would wait for a
    /// change that already came.
    fileprivate func endIfAlreadyWoken(runID: Int64, wakeOn: WakeCondition, operation: String) throws {
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
