import Foundation
import HopStore

/// The start-up flow written by hand on SQLite's C API, the floor for `startup-flow`: for a first
/// use without a session, the same facts the engine records (the run, each hop and unhop, both
/// decisions, the effect with its first-use flag, the completion) in the same tables, committed
/// once per step boundary, as a program written for this one flow would: 5 transactions a flow.
final class RawStartupFlow {
    private let raw: RawSQLite

    init(path: String, durability: HopStore.Durability) async throws {
        _ = try await Fixtures.hopDatabase(path, durability: durability)
        raw = try RawSQLite(path: path, synchronous: durability == .full ? "FULL" : "NORMAL")
    }

    /// Runs the flow for new subjects named `prefix-N`, N in `indices`, one after another;
    /// returns the seconds taken.
    func flows(_ indices: Range<Int>, prefix: String) async throws -> Double {
        try await Measure.seconds {
            for index in indices { try flow(subject: "\(prefix)-\(index)") }
        }
    }

    private func flow(subject: String) throws {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var seq: Int64 = 0
        var runID: Int64 = 0
        func append(_ kind: String, _ step: String?, token: String? = nil, value: String? = nil) throws {
            seq += 1
            try raw.run(
                "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                [
                    .integer(runID), .integer(seq), .text(kind), step.map(RawSQLite.Value.text) ?? .null,
                    token.map(RawSQLite.Value.text) ?? .null, value.map(RawSQLite.Value.text) ?? .null, .integer(now),
                ])
        }
        func enter(_ step: String) throws {
            let token = "\(subject)-\(step)"
            try append("hop", step, token: token)
            try raw.run(
                "UPDATE runs SET current_step = ?2, current_token = ?3, updated_at = ?4 WHERE id = ?1",
                [.integer(runID), .text(step), .text(token), .integer(now)])
        }
        func leave(_ step: String) throws {
            try append("unhop", step, token: "\(subject)-\(step)")
        }
        func transaction(_ body: () throws -> Void) throws {
            try raw.run("BEGIN IMMEDIATE")
            try body()
            try raw.run("COMMIT")
        }
        // 1. The run starts and enters splash.
        try transaction {
            runID =
                try raw.run(
                    """
                    INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
                    VALUES ('startup', ?1, '1', 'running', ?2, ?2) RETURNING id
                    """, [.text(subject), .integer(now)]) ?? 0
            try enter("splash")
        }
        // 2. Splash ends; first use is read; onboarding is entered.
        try transaction {
            try leave("splash")
            let used = try raw.run(
                "SELECT 1 FROM first_use WHERE subject = ?1 AND feature = 'onboarding'", [.text(subject)])
            try append("decision", "isFirstUse(onboarding)", value: used == nil ? "true" : "false")
            try enter("onboarding")
        }
        // 3. Onboarding ends and is marked used; the session is read; login is entered.
        try transaction {
            try leave("onboarding")
            try raw.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, 'onboarding', ?2) ON CONFLICT DO NOTHING",
                [.text(subject), .integer(now)])
            try append("effect", "markUsed(onboarding)")
            let session = try raw.run("SELECT 1 FROM sessions WHERE subject = ?1", [.text(subject)])
            try append("decision", "session", value: session == nil ? "null" : "{}")
            try enter("login")
        }
        // 4. Login ends; main is entered.
        try transaction {
            try leave("login")
            try enter("main")
        }
        // 5. Main ends; the run completes.
        try transaction {
            try leave("main")
            try append("complete", nil)
            try raw.run(
                """
                UPDATE runs SET status = 'completed', current_step = NULL, current_token = NULL, updated_at = ?2
                WHERE id = ?1
                """, [.integer(runID), .integer(now)])
        }
    }
}
