import Foundation

/// Starting, ending and restarting runs.
extension HopStore {
    // MARK: Starting, ending and restarting runs

    /// Starts a run of `flow` for `subject`, or returns the unfinished one (at most one exists).
    package func startRun(
        flow: String, subject: String, version: String
    ) async throws -> (run: RunRecord, created: Bool) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(version, as: "flow version")
        let operation = "start run of \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            if let existing = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation) {
                return (existing, false)
            }
            return (try tx.insertRun(flow: flow, subject: subject, version: version, operation: operation), true)
        }
    }

    /// Cancels the unfinished run of `flow` for `subject`: it never advances again. History is kept.
    /// - Throws: `.notFound` when the subject has no unfinished run of the flow.
    @discardableResult
    public func cancelRun(flow: String, subject: String, reason: String = "cancelled") async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        let operation = "cancel \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            guard let run = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation) else {
                throw tx.noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            try tx.append(runID: run.id, .cancel, step: run.currentStep, value: reason, operation: operation)
            try tx.setStatus(run.id, .cancelled, operation: operation)
            return try tx.requireRun(run.id, operation: operation)
        }
    }

    /// Ends the latest run of `flow` for `subject` (cancelling it when unfinished) and creates a
    /// new run that starts from the beginning the next time an engine runs the flow.
    /// The old run's history is kept.
    @discardableResult
    ///
    /// - Parameter version: the new run's flow version; the old run's when `nil`.
    public func restartRun(flow: String, subject: String, version: String? = nil) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "restart \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            guard
                let latest = try tx.queryOne(
                    "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
                    [.text(flow), .text(subject)], operation: operation, RunRecord.init(row:))
            else {
                throw tx.refuse(
                    .notFound, operation, "there is no run of flow '\(flow)' for subject '\(subject)'",
                    hint: "Check the names with `hopctl status`")
            }
            if latest.status.isUnfinished {
                try tx.append(
                    runID: latest.id, .restart, step: latest.currentStep, value: "restarted", operation: operation)
                try tx.setStatus(latest.id, .cancelled, operation: operation)
            }
            return try tx.insertRun(
                flow: flow, subject: subject, version: version ?? latest.flowVersion, operation: operation)
        }
    }

    /// Records that the flow body of run `runID` returned: the run is completed.
    @discardableResult
    package func completeRun(runID: Int64, owner: String? = nil) async throws -> HistoryEntry {
        let operation = "complete run \(runID)"
        return try await transaction(operation) { tx in
            _ = try tx.requireRunning(runID, owner: owner, operation: operation)
            let event = try tx.append(runID: runID, .complete, operation: operation)
            try tx.setStatus(runID, .completed, operation: operation)
            return event
        }
    }

    /// Marks run `runID` diverged: the flow code asked for another path than its history.
    @discardableResult
    package func divergeRun(
        runID: Int64, step: String?, message: String, owner: String? = nil
    ) async throws -> HistoryEntry {
        let operation = "mark run \(runID) diverged"
        return try await transaction(operation) { tx in
            _ = try tx.requireUnfinished(runID, owner: owner, operation: operation)
            let event = try tx.append(runID: runID, .diverge, step: step, value: message, operation: operation)
            try tx.setStatus(runID, .diverged, operation: operation)
            return event
        }
    }
}
