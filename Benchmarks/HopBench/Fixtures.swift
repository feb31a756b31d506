import Foundation
import HopStore

/// Databases the scenarios start from, written in bulk through the raw C API.
enum Fixtures {
    /// The flow of the `resume` and `hopctl` databases: ten steps in a row.
    static let chainSteps = (0..<10).map { "s\($0)" }

    /// Creates (migrates) a new Hop database at `path` and returns it.
    /// - Throws: when `path` exists: a scenario measures from the database it wrote itself, and
    ///   one left by an earlier run (`--child NAME --folder DIR` twice on one folder) would make
    ///   the figures lie, or the fixture fail on its first insert.
    static func hopDatabase(_ path: String, durability: HopStore.Durability = .full) async throws -> HopStore {
        guard !FileManager.default.fileExists(atPath: path) else {
            throw BenchError(
                "\(path) exists: a scenario starts from databases of its own; give --folder a new or empty folder")
        }
        return try await HopStore.open(path: path, options: .init(durability: durability))
    }

    /// Writes `count` runs of the `chain` flow, run `i` in flight at step `s(i % 10)` after
    /// unhopping the steps before it: about 10 history rows a run (1,000,000 for 100,000 runs).
    /// With `parked`, every run is parked on its step instead of running.
    static func writeChainRuns(_ count: Int, to path: String, parked: Bool = false) throws {
        let raw = try RawSQLite(path: path, synchronous: "NORMAL")
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try raw.execute("BEGIN IMMEDIATE")
        for index in 0..<count {
            let at = index % chainSteps.count
            let token = "t\(index)-\(at)"
            let id = Int64(index + 1)
            try raw.run(
                """
                INSERT INTO runs (id, flow, subject, flow_version, status, current_step, current_token, created_at, updated_at)
                VALUES (?1, 'chain', ?2, '1', ?3, ?4, ?5, ?6, ?6)
                """,
                [
                    .integer(id), .text("subject-\(index)"), .text(parked ? "parked" : "running"),
                    .text(chainSteps[at]), .text(token), .integer(now),
                ])
            var seq: Int64 = 0
            func append(_ kind: String, _ step: String, _ token: String) throws {
                seq += 1
                try raw.run(
                    "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6)",
                    [.integer(id), .integer(seq), .text(kind), .text(step), .text(token), .integer(now)])
            }
            for done in 0..<at {
                try append("hop", chainSteps[done], "t\(index)-\(done)")
                try append("unhop", chainSteps[done], "t\(index)-\(done)")
            }
            try append("hop", chainSteps[at], token)
        }
        try raw.execute("COMMIT")
        try raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    }

    /// Writes one run of the `loop` flow (subject `loop`) that went round its `tick` step
    /// `laps` times, each a hop and an unhop, and is in flight at its next tick.
    static func writeLoopRun(laps: Int, to path: String) throws {
        let raw = try RawSQLite(path: path, synchronous: "NORMAL")
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try raw.execute("BEGIN IMMEDIATE")
        try raw.run(
            """
            INSERT INTO runs (id, flow, subject, flow_version, status, current_step, current_token, created_at, updated_at)
            VALUES (1, 'loop', 'loop', '1', 'running', 'tick', ?1, ?2, ?2)
            """,
            [.text("t\(laps)"), .integer(now)])
        var seq: Int64 = 0
        for lap in 0...laps {
            for kind in lap < laps ? ["hop", "unhop"] : ["hop"] {
                seq += 1
                try raw.run(
                    "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (1, ?1, ?2, 'tick', ?3, NULL, ?4)",
                    [.integer(seq), .text(kind), .text("t\(lap)"), .integer(now)])
            }
        }
        try raw.execute("COMMIT")
        try raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    }
}
