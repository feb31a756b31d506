import Foundation

/// A resume written by hand on SQLite's C API, the floor for `resume`: the same database work
/// an engine's resume does for each run, in the same statements, and nothing else — the runs
/// claimed and their histories read 2,000 at a time (every column of every row read), then each
/// run's step ended and the run completed (its check, the unhop, the completion, the update of
/// its row), 1,000 runs a transaction with synchronous=FULL, as the engine's group commits do
/// under that load. No replay, no step, no task: what bounds a resume on one SQLite connection.
///
/// Timed as the engine's resume is: until every run has been claimed and read, and every run but
/// the last `inFlight` (the engine's `maxConcurrentRuns`, whose runs are still in their steps
/// when its clock stops) completed.
final class RawResume {
    private let raw: RawSQLite
    private let owner = "hop-bench-raw#0123456789abcdef"

    init(path: String) throws {
        raw = try RawSQLite(path: path, synchronous: "FULL")
    }

    /// Resumes the `runs` running runs of the database; returns the seconds taken and how
    /// many runs it completed in them.
    func resume(
        runs: Int, inFlight: Int, batch: Int = 2000, perCommit: Int = 1000
    ) async throws -> (
        seconds: Double, completed: Int
    ) {
        let completing = max(0, runs - inFlight)
        var completed = 0
        let seconds = try await Measure.seconds {
            var pending: [Int64] = []
            var after: Int64 = 0
            var claimed = 0
            while claimed < runs {
                let ids = try claim(after: after, limit: batch)
                guard let last = ids.last else { throw BenchError("the raw resume found \(claimed) of \(runs) runs") }
                after = last
                claimed += ids.count
                try readHistories(ids)
                for id in ids where completed + pending.count < completing {
                    pending.append(id)
                    if pending.count == perCommit || completed + pending.count == completing {
                        try complete(pending)
                        completed += pending.count
                        pending.removeAll(keepingCapacity: true)
                    }
                }
            }
        }
        return (seconds, completed)
    }

    /// Claims the next `limit` running runs after `after`, as the engine claims a batch: a
    /// takeover entry where one changes hands, then the owner set, every column returned.
    private func claim(after: Int64, limit: Int) throws -> [Int64] {
        var candidates: [Int64] = []
        try raw.forEachRow(
            """
            SELECT id, flow, subject, flow_version, status, current_step, current_token, wake_on, owner,
                lease_expires_at, created_at, updated_at, wake_at
            FROM runs INDEXED BY runs_unfinished
            WHERE status IN ('running', 'parked') AND status = 'running' AND flow = 'chain' AND owner IS NULL AND id > ?1
            ORDER BY id LIMIT ?2
            """, [.integer(after), .integer(Int64(limit))]
        ) { row in
            row.readAll()
            candidates.append(row.int64(0))
        }
        guard !candidates.isEmpty else { return [] }
        let list = RawSQLite.Value.text("[" + candidates.map(String.init).joined(separator: ",") + "]")
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let claimable =
            "id IN (SELECT value FROM json_each(?1)) AND status = 'running' AND (owner IS NULL OR owner = ?2 OR lease_expires_at < ?3)"
        var claimed: [Int64] = []
        try raw.run("BEGIN IMMEDIATE")
        try raw.run(
            """
            INSERT INTO history (run_id, seq, kind, step, value, at)
            SELECT id, coalesce((SELECT max(seq) FROM history WHERE run_id = runs.id), 0) + 1, 'takeover', ?4,
                json_object('from', last_owner, 'to', ?2), ?3
            FROM runs WHERE \(claimable) AND last_owner IS NOT NULL AND last_owner != ?2
            """, [list, .text(owner), .integer(now), .text("hop-bench-raw")])
        try raw.forEachRow(
            """
            UPDATE runs SET owner = ?2, last_owner = ?2, lease_expires_at = ?4 WHERE \(claimable)
            RETURNING id, flow, subject, flow_version, status, current_step, current_token, wake_on, owner,
                lease_expires_at, created_at, updated_at, wake_at
            """, [list, .text(owner), .integer(now), .integer(now + 30_000)]
        ) { row in
            row.readAll()
            claimed.append(row.int64(0))
        }
        try raw.run("COMMIT")
        return claimed
    }

    /// Reads the histories of `ids` in one statement, every column of every entry.
    private func readHistories(_ ids: [Int64]) throws {
        let list = RawSQLite.Value.text("[" + ids.map(String.init).joined(separator: ",") + "]")
        var bytes = 0
        try raw.forEachRow(
            """
            SELECT run_id, seq, kind, step, token, value, at FROM history
            WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq
            """, [list]
        ) { row in bytes += row.readAll() }
        guard bytes > 0 else { throw BenchError("the raw resume read no history") }
    }

    /// Ends each run's step and completes it, in one transaction: the engine's check of the
    /// run (owner, status, step, last entry's number), its two entries and its row's update.
    private func complete(_ ids: [Int64]) throws {
        guard !ids.isEmpty else { return }
        try raw.run("BEGIN IMMEDIATE")
        for id in ids {
            var head: (owner: RawSQLite.Value, step: RawSQLite.Value, token: RawSQLite.Value, last: Int64)?
            try raw.forEachRow(
                """
                SELECT id, subject, status, owner, current_step, current_token,
                    (SELECT coalesce(max(seq), 0) FROM history WHERE run_id = runs.id)
                FROM runs WHERE id = ?1
                """, [.integer(id)]
            ) { row in head = (row.text(3), row.text(4), row.text(5), row.int64(6)) }
            guard let head, case .text(let holder) = head.owner, holder == owner else {
                throw BenchError("run \(id) is not held by the raw resume")
            }
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            let insert =
                "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
            try raw.run(
                insert,
                [.integer(id), .integer(head.last + 1), .text("unhop"), head.step, head.token, .null, .integer(now)])
            try raw.run(
                insert, [.integer(id), .integer(head.last + 2), .text("complete"), .null, .null, .null, .integer(now)])
            try raw.run(
                """
                UPDATE runs SET status = ?2, current_step = NULL, current_token = NULL, wake_on = NULL, wake_at = NULL,
                    owner = NULL, lease_expires_at = NULL, updated_at = ?3
                WHERE id = ?1
                """, [.integer(id), .text("completed"), .integer(now)])
        }
        try raw.run("COMMIT")
    }
}
