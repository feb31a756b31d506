#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension HopStore: HopAdministration {
    /// Everything in the file, read in one read transaction (a snapshot that never blocks a
    /// daemon's writes), a part at a time: each table through a cursor stepped a part's rows at a
    /// time, the transaction held open while `body` takes each part. The read has a connection of
    /// its own, so this store reads and writes on meanwhile, and a second snapshot may begin while
    /// a first is still open (a server's restore that starts again after its connection was lost
    /// leaves the first attempt's read waiting on the lost statement).
    package func snapshot(_ body: @escaping SnapshotPartTaker) async throws {
        let operation = "read the whole database"
        // This store's own coalesced writes, committed first, are in the snapshot.
        try makeDurable()
        let reader = try Connection(
            path: path, create: false, durability: options.durability, busyTimeout: options.busyTimeout,
            vfs: options.vfs)
        defer { reader.close() }
        try reader.run("BEGIN DEFERRED", [], operation: operation)
        defer { reader.rollback() }
        try await hand(
            "SELECT \(RunRecord.columns) FROM runs ORDER BY id", RunRecord.init(row:), SnapshotPart.runs, from: reader,
            to: body, operation: operation)
        try await hand(
            "SELECT \(HistoryEntry.columns) FROM history ORDER BY run_id, seq", HistoryEntry.init(row:),
            SnapshotPart.history, from: reader, to: body, operation: operation)
        try await hand(
            "SELECT subject, feature, used_at FROM first_use ORDER BY subject, feature",
            { (subject: $0.text(0), flag: FirstUseFlag(feature: $0.text(1), usedAt: Clock.date($0.int64(2)))) },
            SnapshotPart.firstUse, from: reader, to: body, operation: operation)
        try await hand(
            "SELECT subject, user_id, token, created_at, expires_at FROM sessions ORDER BY subject",
            {
                StoredSession(
                    subject: $0.text(0), userID: $0.text(1), token: $0.text(2),
                    createdAt: Clock.date($0.int64(3)), expiresAt: $0.optionalInt64(4).map(Clock.date))
            }, SnapshotPart.sessions, from: reader, to: body, operation: operation)
        try await hand(
            "SELECT subject, key, value, updated_at FROM facts ORDER BY subject, key",
            {
                (
                    subject: $0.text(0),
                    fact: Fact(key: $0.text(1), value: $0.text(2), updatedAt: Clock.date($0.int64(3)))
                )
            }, SnapshotPart.facts, from: reader, to: body, operation: operation)
    }

    /// Hands the rows of `sql`, read through `reader`, to `body` a part at a time.
    private func hand<T>(
        _ sql: String, _ map: (Row) throws -> T, _ part: ([T]) -> SnapshotPart, from reader: Connection,
        to body: SnapshotPartTaker, operation: String
    ) async throws {
        let cursor = try reader.cursor(sql, [], operation: operation)
        while case let rows = try cursor.next(SnapshotPart.rowsPerPart, map), !rows.isEmpty {
            try await body(part(rows))
        }
    }

    /// Writes the parts `parts` hands out in one write transaction, begun before the first and
    /// committed once `parts` returns (rolled back when anything throws).
    package func restore(
        _ parts: @escaping @Sendable (_ write: @escaping SnapshotPartTaker) async throws -> Void
    ) async throws {
        let operation = "copy into \(path)"
        try makeDurable()
        try connection.run("BEGIN IMMEDIATE", [], operation: operation)
        do {
            let held =
                try connection.queryOne(
                    """
                    SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM first_use),
                           (SELECT count(*) FROM sessions), (SELECT count(*) FROM facts)
                    """, [], operation: operation
                ) { [$0.int64(0), $0.int64(1), $0.int64(2), $0.int64(3)] } ?? []
            try StorageRules(location: path).checkEmptyTarget(counts: held, operation: operation)
            let copy = OpenCopy()
            defer { copy.end() }
            try await parts { part in try await self.insert(part, operation: operation, while: copy) }
            try connection.commit(operation)
        } catch {
            connection.rollback()
            throw error
        }
    }

    /// Inserts the rows of `part` in the open transaction of `copy`, while it is open.
    private func insert(_ part: SnapshotPart, operation: String, while copy: OpenCopy) throws {
        guard copy.isOpen, connection.isInTransaction else {
            throw HopError(
                .refused, operation: operation, path: path, reason: "the copy's transaction is over",
                hint: "Write every part before the function given to restore returns")
        }
        switch part {
        case .runs(let runs):
            for run in runs {
                try connection.run(
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
        case .history(let entries):
            for entry in entries {
                try connection.run(
                    "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    [
                        .integer(entry.runID), .integer(entry.seq), .text(entry.kind.rawValue), .optional(entry.step),
                        .optional(entry.token), .optional(entry.value), .integer(Clock.milliseconds(entry.at)),
                    ], operation: operation)
            }
        case .firstUse(let flags):
            for (subject, flag) in flags {
                try connection.run(
                    "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3)",
                    [.text(subject), .text(flag.feature), .integer(Clock.milliseconds(flag.usedAt))],
                    operation: operation)
            }
        case .sessions(let sessions):
            for session in sessions {
                try connection.run(
                    "INSERT INTO sessions (subject, user_id, token, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    [
                        .text(session.subject), .text(session.userID), .text(session.token),
                        .integer(Clock.milliseconds(session.createdAt)),
                        .optional(session.expiresAt.map(Clock.milliseconds)),
                    ], operation: operation)
            }
        case .facts(let facts):
            for (subject, fact) in facts {
                try connection.run(
                    "INSERT INTO facts (subject, key, value, updated_at) VALUES (?1, ?2, ?3, ?4)",
                    [.text(subject), .text(fact.key), .text(fact.value), .integer(Clock.milliseconds(fact.updatedAt))],
                    operation: operation)
            }
        }
    }
}
