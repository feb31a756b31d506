#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension HopStore: HopAdministration {
    /// Everything in the file, read in one read transaction (a snapshot that never blocks a daemon's writes).
    package func snapshot() throws -> HopSnapshot {
        try connection.read("read the whole database") {
            let operation = "read the whole database"
            return HopSnapshot(
                runs: try connection.query(
                    "SELECT \(RunRecord.columns) FROM runs ORDER BY id", [], operation: operation, RunRecord.init(row:)),
                history: try connection.query(
                    "SELECT \(HistoryEntry.columns) FROM history ORDER BY run_id, seq", [], operation: operation,
                    HistoryEntry.init(row:)),
                firstUse: try connection.query(
                    "SELECT subject, feature, used_at FROM first_use ORDER BY subject, feature", [],
                    operation: operation
                ) { (subject: $0.text(0), flag: FirstUseFlag(feature: $0.text(1), usedAt: Clock.date($0.int64(2)))) },
                sessions: try connection.query(
                    "SELECT subject, user_id, token, created_at, expires_at FROM sessions ORDER BY subject", [],
                    operation: operation
                ) {
                    StoredSession(
                        subject: $0.text(0), userID: $0.text(1), token: $0.text(2),
                        createdAt: Clock.date($0.int64(3)), expiresAt: $0.optionalInt64(4).map(Clock.date))
                },
                facts: try connection.query(
                    "SELECT subject, key, value, updated_at FROM facts ORDER BY subject, key", [], operation: operation
                ) {
                    (
                        subject: $0.text(0),
                        fact: Fact(key: $0.text(1), value: $0.text(2), updatedAt: Clock.date($0.int64(3)))
                    )
                })
        }
    }

    package func restore(_ snapshot: HopSnapshot) async throws {
        let operation = "copy into \(path)"
        let location = path
        try await transaction(operation) { tx in
            let held =
                try tx.query(
                    """
                    SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM first_use),
                           (SELECT count(*) FROM sessions), (SELECT count(*) FROM facts)
                    """, [], operation: operation
                ) { [$0.int64(0), $0.int64(1), $0.int64(2), $0.int64(3)] }.first ?? []
            try StorageRules(location: location).checkEmptyTarget(counts: held, operation: operation)
            for run in snapshot.runs {
                try tx.run(
                    """
                    INSERT INTO runs (id, flow, subject, flow_version, status, current_step, current_token, wake_on,
                                      created_at, updated_at, wake_at)
                    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                    """,
                    [
                        .integer(run.id), .text(run.flow), .text(run.subject), .text(run.flowVersion),
                        .text(run.status.rawValue), .optional(run.currentStep), .optional(run.currentToken),
                        .optional(run.wakeOn?.rawValue), .integer(Clock.milliseconds(run.createdAt)),
                        .integer(Clock.milliseconds(run.updatedAt)), .optional(run.wakeAt.map(Clock.milliseconds)),
                    ], operation: operation)
            }
            for entry in snapshot.history {
                try tx.run(
                    "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    [
                        .integer(entry.runID), .integer(entry.seq), .text(entry.kind.rawValue), .optional(entry.step),
                        .optional(entry.token), .optional(entry.value), .integer(Clock.milliseconds(entry.at)),
                    ], operation: operation)
            }
            for (subject, flag) in snapshot.firstUse {
                try tx.run(
                    "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3)",
                    [.text(subject), .text(flag.feature), .integer(Clock.milliseconds(flag.usedAt))],
                    operation: operation)
            }
            for session in snapshot.sessions {
                try tx.run(
                    "INSERT INTO sessions (subject, user_id, token, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    [
                        .text(session.subject), .text(session.userID), .text(session.token),
                        .integer(Clock.milliseconds(session.createdAt)),
                        .optional(session.expiresAt.map(Clock.milliseconds)),
                    ], operation: operation)
            }
            for (subject, fact) in snapshot.facts {
                try tx.run(
                    "INSERT INTO facts (subject, key, value, updated_at) VALUES (?1, ?2, ?3, ?4)",
                    [.text(subject), .text(fact.key), .text(fact.value), .integer(Clock.milliseconds(fact.updatedAt))],
                    operation: operation)
            }
        }
    }
}
