#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Starting, ending and restarting runs.
extension HopStore {
    // MARK: Starting, ending and restarting runs

    /// Starts a run of `flow` for `subject`, or returns the unfinished one (at most one exists).
    /// - Parameters:
    ///   - owner: the engine that executes the new run, holding it until `until`; `nil` leaves
    ///     it for any engine to claim.
    ///   - durability: when the new run must be durable.
    package nonisolated func startRun(
        flow: String, subject: String, version: String, owner: String? = nil, until: Date? = nil,
        durability: WriteDurability = .now
    ) async throws -> (run: RunRecord, created: Bool) {
        try await startRun(
            flow: flow, subject: subject, version: version, owner: owner, lease: until.map(LeaseLength.init(until:)),
            durability: durability)
    }

    private func startRun(
        flow: String, subject: String, version: String, owner: String?, lease length: LeaseLength?,
        durability: WriteDurability
    ) async throws -> (run: RunRecord, created: Bool) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(version, as: "flow version")
        let operation = "start run of \(flow) for \(subject)"
        let started: (run: RunRecord, created: Bool) = try await write(durability, operation) { tx in
            if let existing = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation) {
                return (existing, false)
            }
            let run = try tx.insertRun(
                flow: flow, subject: subject, version: version, owner: owner, until: length?.endFromNow,
                operation: operation)
            return (run, true)
        }
        if started.created, durability == .coalesced { holdsWrites(of: started.run.id) }
        return started
    }

    /// Records a new run of `flow` for `subject`, from outside any engine (`hopctl start`): no
    /// engine holds it, so the first engine with the flow's version that notices the change
    /// claims it and executes it from the first step.
    ///
    /// - Parameters:
    ///   - version: the flow version the run executes on; `nil` takes the version of the flow's
    ///     newest run here (for any subject), the one a daemon last started.
    ///   - allowingNewFlow: record the run even when no run of `flow` exists here yet (a new
    ///     flow, or a mistyped name); `version` is then required.
    ///   - latest: the subject's latest run of the flow as the caller saw it, so that a retried
    ///     start starts no second run: refused unless it still is (even once the run the first
    ///     try started has finished, which an unfinished run's refusal alone does not cover).
    /// - Throws: `.refused`, changing nothing, when the subject has an unfinished run of the flow
    ///   (naming it), when `latest` is not its latest run, or when no run of `flow` exists here
    ///   and `allowingNewFlow` is false (naming the flows that do exist), or when `version` is
    ///   missing for a new flow.
    @discardableResult
    public func startNewRun(
        flow: String, subject: String, version: String? = nil, allowingNewFlow: Bool = false,
        latest: ExpectedLatestRun? = nil
    ) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "start \(flow) for \(subject)"
        let run = try await transaction(operation) { tx in
            let rules = StorageRules(location: tx.path)
            if let latest {
                try rules.checkLatest(
                    latest, latest: try tx.latestRun(flow: flow, subject: subject, operation: operation), flow: flow,
                    subject: subject, operation: operation)
            }
            if let existing = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation) {
                throw rules.alreadyUnfinished(existing, operation: operation)
            }
            let newest = try tx.queryOne(Self.newestVersionSQL, [.text(flow)], operation: operation) { $0.text(0) }
            let known =
                StorageRules.needsKnownFlows(newest: newest, allowingNewFlow: allowingNewFlow)
                ? try tx.query(Self.flowNamesSQL, [], operation: operation) { $0.text(0) } : []
            let chosen = try rules.versionForNewRun(
                flow: flow, version: version, newest: newest, allowingNewFlow: allowingNewFlow, known: known,
                operation: operation)
            return try tx.insertRun(flow: flow, subject: subject, version: chosen, operation: operation)
        }
        return run
    }

    /// The version of the newest run of flow `?1`: its id found in one search of the index of
    /// runs by flow and id (schema 8; before it, every run of the flow was read, and before
    /// that sorted too).
    static let newestVersionSQL =
        "SELECT flow_version FROM runs WHERE id = (SELECT max(id) FROM runs WHERE flow = ?1)"

    /// Cancels the unfinished run of `flow` for `subject`: it never advances again. History is kept.
    ///
    /// - Parameter runID: the run meant, so that a retried cancel changes nothing: refused unless
    ///   it is the subject's unfinished run of the flow.
    /// - Throws: `.notFound` when the subject has no unfinished run of the flow, or `runID` is
    ///   no run of it; `.refused` when `runID` is not the unfinished one.
    @discardableResult
    public func cancelRun(
        flow: String, subject: String, runID: Int64? = nil, reason: String = "cancelled"
    ) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        let operation = "cancel \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let unfinished = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation)
            try tx.checkNamedRun(
                runID, current: unfinished, flow: flow, subject: subject, verb: "cancel", operation: operation)
            guard let run = unfinished else {
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
    ///
    /// - Parameters:
    ///   - runID: the run meant, so that a retried restart changes nothing: refused unless it is
    ///     the subject's latest run of the flow.
    ///   - version: the new run's flow version; the old run's when `nil`.
    @discardableResult
    public func restartRun(
        flow: String, subject: String, runID: Int64? = nil, version: String? = nil
    ) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "restart \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let latest = try tx.requireLatestRun(flow: flow, subject: subject, operation: operation)
            try tx.checkNamedRun(
                runID, current: latest, flow: flow, subject: subject, verb: "restart", operation: operation)
            if latest.status.isUnfinished {
                try tx.append(
                    runID: latest.id, .restart, step: latest.currentStep, value: "restarted", operation: operation)
                try tx.setStatus(latest.id, .cancelled, operation: operation)
            }
            return try tx.insertRun(
                flow: flow, subject: subject, version: version ?? latest.flowVersion, operation: operation)
        }
    }

    /// Marks run `runID` diverged: the flow code asked for another path than its history. With
    /// `following`, refused, changing nothing, unless the run's history ends at that entry.
    @discardableResult
    package func divergeRun(
        runID: Int64, step: String?, message: String, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        let operation = "mark run \(runID) diverged"
        return try await write(.now, operation, runID: runID) { tx in
            _ = try tx.requireUnfinished(runID, owner: owner, following: following, operation: operation)
            let event = try tx.append(runID: runID, .diverge, step: step, value: message, operation: operation)
            try tx.setStatus(runID, .diverged, operation: operation)
            return event
        }
    }

    /// Starts a new run of `flow` for `subject` that takes the history of run `runID` (the latest
    /// run when `nil`) up to entry `seq` as already done — its steps are not entered again, its
    /// decisions and outputs stand — and continues from there on the flow code of `version` (the
    /// old run's when `nil`). The old run, ended if it was not, and the new one are linked by
    /// `fork` entries. For a run that diverged after a code change, or is stuck.
    ///
    /// - Throws: `.notFound` for no such run; `.refused`, changing nothing, when `seq` is not an
    ///   entry of the run, when a step would be in flight at `seq` (its hop without its end), or
    ///   when another run of the subject is unfinished.
    public func forkRun(
        flow: String, subject: String, runID: Int64? = nil, through seq: Int64, version: String? = nil
    ) async throws -> (old: RunRecord, new: RunRecord) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "fork \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let old: RunRecord
            if let runID {
                old = try tx.requireRun(runID, operation: operation)
                guard old.flow == flow, old.subject == subject else {
                    throw tx.refuse(
                        .notFound, operation,
                        "run \(runID) belongs to flow '\(old.flow)' for subject '\(old.subject)', not '\(flow)' for '\(subject)'",
                        hint: "Pass the matching --flow and --subject")
                }
            } else {
                old = try tx.requireLatestRun(flow: flow, subject: subject, operation: operation)
            }
            let rules = StorageRules(location: tx.path)
            if let other = try tx.unfinishedRun(flow: flow, subject: subject, operation: operation), other.id != old.id
            {
                throw rules.otherRunUnfinished(other, operation: operation)
            }
            try rules.checkFork(
                of: old, at: try tx.forkPoint(of: old.id, through: seq, operation: operation), through: seq,
                operation: operation)
            if old.status.isUnfinished { try tx.setStatus(old.id, .cancelled, operation: operation) }
            let new = try tx.insertRun(
                flow: flow, subject: subject, version: version ?? old.flowVersion, operation: operation)
            let link = try tx.append(
                runID: new.id, .fork, value: #"{"from":\#(old.id),"through":\#(seq)}"#, operation: operation)
            // The entries taken follow the link, numbered on from it and dated with it, in one
            // statement that never brings them into this process; their deadlines are copied as
            // they are kept (by the uptime clock of their boot), so that they read the same.
            try tx.run(
                """
                INSERT INTO history (run_id, seq, kind, step, token, value, at, deadline_boot, deadline_uptime)
                SELECT ?1, ?2 + row_number() OVER (ORDER BY seq), kind, step, token, value, ?3, deadline_boot,
                    deadline_uptime
                FROM history WHERE run_id = ?4 AND seq <= ?5 AND kind IN \(HistoryKind.replayedSQL)
                """,
                [
                    .integer(new.id), .integer(link.seq), .integer(Clock.milliseconds(link.at)), .integer(old.id),
                    .integer(seq),
                ], operation: operation)
            try tx.append(runID: old.id, .fork, value: #"{"to":\#(new.id),"through":\#(seq)}"#, operation: operation)
            return (try tx.requireRun(old.id, operation: operation), try tx.requireRun(new.id, operation: operation))
        }
    }
}

extension WriteTransaction {
    /// What a fork of run `runID` through entry `seq` is checked against (``ForkPoint``), read
    /// in a few small results rather than by reading the run's history.
    fileprivate func forkPoint(of runID: Int64, through seq: Int64, operation: String) throws -> ForkPoint {
        let lastSeq =
            try queryOne(
                "SELECT max(seq) FROM history WHERE run_id = ?1", [.integer(runID)], operation: operation,
                { $0.optionalInt64(0) ?? 0 }) ?? 0
        let links = try query(
            "SELECT value FROM history WHERE run_id = ?1 AND kind = 'fork'", [.integer(runID)], operation: operation,
            { $0.optionalText(0) })
        let hop = try queryOne(
            "SELECT seq, step, token FROM history WHERE run_id = ?1 AND seq <= ?2 AND kind = 'hop' ORDER BY seq DESC LIMIT 1",
            [.integer(runID), .integer(seq)], operation: operation,
            { ($0.int64(0), $0.optionalText(1), $0.optionalText(2)) })
        var ended = false
        if let hop {
            ended =
                try queryOne(
                    """
                    SELECT 1 FROM history WHERE run_id = ?1 AND seq <= ?2
                        AND kind IN \(HistoryKind.stepEndsSQL) AND token IS ?3 LIMIT 1
                    """,
                    [.integer(runID), .integer(seq), .optional(hop.2)], operation: operation, { _ in true }
                ) ?? false
        }
        return ForkPoint(
            lastSeq: lastSeq, links: links, lastHop: hop.map { (seq: $0.0, step: $0.1) }, lastHopEnded: ended)
    }
}
