import Foundation

extension HopStore {
    /// Takes run `runID` for the engine `owner` until `until`, unless another engine holds a
    /// live lease on it. Returns the run when taken, `nil` when it is held elsewhere or finished.
    public func claim(runID: Int64, owner: String, until: Date) async throws -> RunRecord? {
        let operation = "claim run \(runID)"
        return try await transaction(operation) { [self] in
            let changed = try connection.run(
                """
                UPDATE runs SET owner = ?2, lease_expires_at = ?3
                WHERE id = ?1 AND status = 'running' AND (owner IS NULL OR owner = ?2 OR lease_expires_at < ?4)
                """,
                [.integer(runID), .text(owner), .integer(Clock.milliseconds(until)), .integer(Clock.nowMilliseconds())],
                operation: operation)
            return changed == 1 ? try requireRun(runID, operation: operation) : nil
        }
    }

    /// Takes every run of `runIDs` that no other engine holds for `owner` until `until`, in one
    /// transaction; returns the runs taken, as stored (a resuming engine claims its runs so).
    public func claim(runIDs: [Int64], owner: String, until: Date) async throws -> [RunRecord] {
        guard !runIDs.isEmpty else { return [] }
        let operation = "claim \(runIDs.count) runs"
        let list = "[" + runIDs.map(String.init).joined(separator: ",") + "]"
        return try await transaction(operation) { [self] in
            try connection.query(
                """
                UPDATE runs SET owner = ?2, lease_expires_at = ?3
                WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'running'
                    AND (owner IS NULL OR owner = ?2 OR lease_expires_at < ?4)
                RETURNING \(RunRecord.columns)
                """,
                [.text(list), .text(owner), .integer(Clock.milliseconds(until)), .integer(Clock.nowMilliseconds())],
                operation: operation, RunRecord.init(row:))
        }
    }

    /// Extends every lease `owner` holds to `until`, in one statement; returns how many.
    @discardableResult
    public func renewLeases(owner: String, until: Date) async throws -> Int {
        try await transaction("renew leases") { [self] in
            try connection.run(
                "UPDATE runs SET lease_expires_at = ?2 WHERE owner = ?1 AND status = 'running'",
                [.text(owner), .integer(Clock.milliseconds(until))], operation: "renew leases")
        }
    }

    /// Gives up `owner`'s lease on run `runID`, so another engine may take it at once.
    public func release(runID: Int64, owner: String) async throws {
        try await transaction("release run \(runID)") { [self] in
            try connection.run(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE id = ?1 AND owner = ?2",
                [.integer(runID), .text(owner)], operation: "release run \(runID)")
        }
    }

    /// Unfinished, unparked runs of `flows` that no engine holds (no owner, or an expired lease), oldest first.
    public func claimableRuns(flows: [String], now: Date = Date()) throws -> [RunRecord] {
        var runs: [RunRecord] = []
        for flow in flows {
            runs += try connection.query(
                """
                SELECT \(RunRecord.columns) FROM runs
                WHERE status = 'running' AND flow = ?1 AND (owner IS NULL OR lease_expires_at < ?2)
                ORDER BY id
                """,
                [.text(flow), .integer(Clock.milliseconds(now))], operation: "list runs to resume of \(flow)", RunRecord.init(row:))
        }
        return runs.sorted { $0.id < $1.id }
    }

    /// Parked runs whose step's deadline has passed.
    public func dueTimeouts(now: Date = Date()) throws -> [RunRecord] {
        try connection.query(
            "SELECT \(RunRecord.columns) FROM runs WHERE wake_at <= ?1 AND status = 'parked' ORDER BY wake_at",
            [.integer(Clock.milliseconds(now))], operation: "list due timeouts", RunRecord.init(row:))
    }

    /// The status of each of `runIDs` that still exists.
    public func statuses(of runIDs: [Int64]) throws -> [Int64: RunStatus] {
        guard !runIDs.isEmpty else { return [:] }
        let list = "[" + runIDs.map(String.init).joined(separator: ",") + "]"
        let rows = try connection.query(
            "SELECT id, status FROM runs WHERE id IN (SELECT value FROM json_each(?1))", [.text(list)],
            operation: "read run statuses") { ($0.int64(0), RunStatus(rawValue: $0.text(1)) ?? .failed) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }
}
