import Foundation
import HopStore
import PostgresNIO

extension PostgresStore: HopAdministration {
    package func runs(flow: String?, subject: String?, status: RunStatus?, limit: Int) async throws -> [RunRecord] {
        if let flow { try validate(flow, as: "flow name") }
        if let subject { try validate(subject, as: "subject") }
        return try await read(
            Self.latestRunsSQL(flow: flow != nil, subject: subject != nil, status: status),
            Self.latestRunsValues(flow: flow, subject: subject, status: status, limit: limit), operation: "list runs",
            RunRecord.init(pg:))
    }

    /// ``LatestRuns/sql(flow:subject:status:marker:runColumns:)`` with PostgreSQL's parameters (`$1`, `$2`, …),
    /// each lease ending no sooner than the grace after the server's start
    /// (``RunRecord/pgColumnsJudgingLeases(grace:)``): `hopctl status` says a lease is live while
    /// no engine may take the run. Its values: ``latestRunsValues(flow:subject:status:limit:)``.
    package static func latestRunsSQL(flow: Bool, subject: Bool, status: RunStatus?) -> String {
        // The grace's placeholder follows those of LatestRuns.
        let bound = LatestRuns.arguments(flow: flow ? "" : nil, subject: subject ? "" : nil, status: status, limit: 0)
        let grace = "$" + String(bound.texts.count + 2)
        return LatestRuns.sql(
            flow: flow, subject: subject, status: status, marker: "$",
            runColumns: RunRecord.pgColumnsJudgingLeases(grace: grace))
    }

    /// The values of ``latestRunsSQL(flow:subject:status:)``'s parameters, in order: those of
    /// ``LatestRuns/arguments(flow:subject:status:limit:)``, then the grace after the server's start.
    package static func latestRunsValues(
        flow: String?, subject: String?, status: RunStatus?, limit: Int
    ) -> [PostgresValue] {
        let bound = LatestRuns.arguments(flow: flow, subject: subject, status: status, limit: limit)
        return [.int(bound.limit)] + bound.texts.map(PostgresValue.text) + [.int(graceAfterServerStart)]
    }

    package func stepEntries(runIDs: [Int64]) async throws -> [Int64: Int64] {
        guard !runIDs.isEmpty else { return [:] }
        // The statement of HopStore's `stepEntries(runIDs:)`.
        let rows = try await read(
            """
            SELECT h.run_id, h.seq FROM runs r JOIN history h ON h.run_id = r.id AND h.token = r.current_token
            WHERE r.id = ANY($1) AND h.kind = 'hop'
            """, [.ints(runIDs)], operation: "read the entries of steps in flight"
        ) { (try $0.int64(0), try $0.int64(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    package func flowNames() async throws -> [String] {
        // One search of an index by flow per flow, not every entry of it (the SQLite statement).
        try await read(HopStore.flowNamesSQL, operation: "list flows") { try $0.text(0) }
    }

    package func allRuns(flow: String, after: Int64, limit: Int) async throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        return try await read(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE flow = $1 AND id > $2 ORDER BY id LIMIT $3",
            [.text(flow), .int(after), .int(Int64(max(0, limit)))], operation: "list runs of \(flow)",
            RunRecord.init(pg:))
    }

    package func history(runID: Int64, after: Int64, through: Int64, limit: Int) async throws -> [HistoryEntry] {
        try await read(
            "SELECT \(HistoryEntry.pgColumns) FROM history WHERE run_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4",
            [.int(runID), .int(after), .int(through), .int(Int64(max(0, limit)))],
            operation: "read history of run \(runID)", HistoryEntry.init(pg:))
    }

    package func historyLengths(runIDs: [Int64]) async throws -> [Int64: Int64] {
        guard !runIDs.isEmpty else { return [:] }
        let rows = try await read(
            """
            SELECT r.id, coalesce((SELECT max(h.seq) FROM history h WHERE h.run_id = r.id), 0)
            FROM unnest($1::bigint[]) AS r(id)
            """, [.ints(runIDs)], operation: "read the lengths of \(runIDs.count) histories"
        ) { (try $0.int64(0), try $0.int64(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    package func hopGraph(flow: String) async throws -> [HopEdge] {
        try validate(flow, as: "flow name")
        return try await read(
            """
            SELECT prev, step, count(*) FROM (
                SELECT h.step AS step, lag(h.step) OVER (PARTITION BY h.run_id ORDER BY h.seq) AS prev
                FROM runs r JOIN history h ON h.run_id = r.id
                WHERE r.flow = $1 AND h.kind = 'hop') AS hops
            GROUP BY prev, step ORDER BY count(*) DESC, prev NULLS FIRST, step
            """,
            [.text(flow)], operation: "read hop graph of \(flow)"
        ) { .counted(from: try $0.optionalText(0), to: try $0.text(1), count: Int(try $0.int64(2))) }
    }

    package func patches(flow: String) async throws -> [PatchUsage] {
        try validate(flow, as: "flow name")
        return try await read(
            """
            SELECT h.step, min(h.at), count(DISTINCT h.run_id) FROM history h JOIN runs r ON r.id = h.run_id
            WHERE h.kind = 'patch' AND r.flow = $1
            GROUP BY h.step ORDER BY h.step
            """,
            [.text(flow)], operation: "list patches of \(flow)"
        ) {
            .counted(name: try $0.text(0), firstRecordedAt: Clock.date(try $0.int64(1)), runs: Int(try $0.int64(2)))
        }
    }

    package func runsWithoutPatch(flow: String, patch: String) async throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        try validate(patch, as: "patch name")
        return try await read(
            """
            SELECT \(RunRecord.pgColumns) FROM runs
            WHERE flow = $1 AND status IN \(RunStatus.pgUnfinished) AND NOT EXISTS (
                SELECT 1 FROM history h WHERE h.run_id = runs.id AND h.kind = 'patch' AND h.step = $2)
            ORDER BY id
            """,
            [.text(flow), .text(patch)], operation: "list runs without patch \(patch) of \(flow)", RunRecord.init(pg:))
    }

    package func firstUseFlags(subject: String) async throws -> [FirstUseFlag] {
        try validate(subject, as: "subject")
        return try await read(
            "SELECT feature, used_at FROM first_use WHERE subject = $1 ORDER BY feature", [.text(subject)],
            operation: "list first-use flags of \(subject)"
        ) { .stored(feature: try $0.text(0), usedAt: Clock.date(try $0.int64(1))) }
    }

    @discardableResult
    package func resetFirstUse(subject: String, features: [String]) async throws -> Int {
        try validate(subject, as: "subject")
        for feature in features { try validate(feature, as: "feature name") }
        return try await transaction("reset first use") { tx in
            try await tx.run(
                "DELETE FROM first_use WHERE subject = $1 AND feature = ANY($2) RETURNING 1",
                [.text(subject), .texts(features)])
        }
    }

    @discardableResult
    package func resetFirstUse(subject: String, feature: String, ifUsedAt usedAt: Date) async throws -> Int {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        let operation = "reset first use of \(feature)"
        return try await transaction(operation) { tx in
            let stored = try await tx.queryOne(
                "SELECT used_at FROM first_use WHERE subject = $1 AND feature = $2 FOR UPDATE",
                [.text(subject), .text(feature)]
            ) { try $0.int64(0) }
            try StorageRules(location: tx.location).checkFlagUsedAt(
                usedAt, stored: stored, feature: feature, subject: subject, operation: operation)
            return try await tx.run(
                "DELETE FROM first_use WHERE subject = $1 AND feature = $2 RETURNING 1",
                [.text(subject), .text(feature)])
        }
    }

    @discardableResult
    package func resetAllFirstUse(subject: String) async throws -> Int {
        try validate(subject, as: "subject")
        return try await transaction("reset first use") { tx in
            try await tx.run("DELETE FROM first_use WHERE subject = $1 RETURNING 1", [.text(subject)])
        }
    }

    // MARK: Moving a deployment

    /// Everything in the database, read in one read-only transaction at `REPEATABLE READ` (one
    /// snapshot, while engines go on writing) and handed to `body` a part at a time as the rows
    /// arrive: the client reads no further ahead than its buffer while `body` takes a part.
    /// Leases are judged as `hopctl status` judges them (``RunRecord/pgColumnsJudgingLeases(grace:)``):
    /// in the grace after a server's start, a run is held though its lease's stored end has passed.
    package func snapshot(_ body: @escaping SnapshotPartTaker) async throws {
        let operation = "read the whole database"
        do {
            try await client.withWatchedConnection { connection in
                func run(_ sql: String) async throws {
                    _ = try await connection.decodedRows(of: PostgresValue.query(sql, [])) { _ in () }
                }
                func each<T>(
                    _ sql: String, binding values: [PostgresValue] = [], _ decode: (Row) throws -> T,
                    _ part: ([T]) -> SnapshotPart
                ) async throws {
                    var rows: [T] = []
                    rows.reserveCapacity(SnapshotPart.rowsPerPart)
                    for try await row in try await connection.query(
                        PostgresValue.query(sql, values), logger: PostgresStore.quiet)
                    {
                        rows.append(try decode(Row(row)))
                        if rows.count == SnapshotPart.rowsPerPart {
                            try await handOver(part(rows))
                            rows.removeAll(keepingCapacity: true)
                        }
                    }
                    if !rows.isEmpty { try await handOver(part(rows)) }
                }
                // An error of `body` (the target's) is passed on as it is, never as this database's.
                func handOver(_ part: SnapshotPart) async throws {
                    do { try await body(part) } catch { throw TakerError(error: error) }
                }
                try await run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                do {
                    try await each(
                        "SELECT \(RunRecord.pgColumnsJudgingLeases(grace: "$1")) FROM runs ORDER BY id",
                        binding: [.int(Self.graceAfterServerStart)], RunRecord.init(pg:), SnapshotPart.runs)
                    try await each(
                        "SELECT \(HistoryEntry.pgColumns) FROM history ORDER BY run_id, seq", HistoryEntry.init(pg:),
                        SnapshotPart.history)
                    try await each(
                        "SELECT subject, feature, used_at FROM first_use ORDER BY subject, feature",
                        {
                            (
                                subject: try $0.text(0),
                                flag: .stored(feature: try $0.text(1), usedAt: Clock.date(try $0.int64(2)))
                            )
                        }, SnapshotPart.firstUse)
                    try await each(
                        "SELECT subject, user_id, token, created_at, expires_at FROM sessions ORDER BY subject",
                        {
                            .stored(
                                subject: try $0.text(0), userID: try $0.text(1), token: try $0.text(2),
                                createdAt: Clock.date(try $0.int64(3)),
                                expiresAt: try $0.optionalInt64(4).map(Clock.date))
                        }, SnapshotPart.sessions)
                    try await each(
                        "SELECT subject, key, value, updated_at FROM facts ORDER BY subject, key",
                        {
                            (
                                subject: try $0.text(0),
                                fact: .stored(
                                    key: try $0.text(1), value: try $0.text(2), updatedAt: Clock.date(try $0.int64(3)))
                            )
                        }, SnapshotPart.facts)
                    try await run("COMMIT")
                } catch {
                    try? await run("ROLLBACK")
                    throw error
                }
            }
        } catch {
            if let taker = Self.cause(of: error) as? TakerError { throw taker.error }
            throw map(error, operation: operation)
        }
    }

    /// Writes the parts `parts` hands out in one transaction, each part one statement (its rows
    /// one bound JSON parameter, expanded by `json_to_recordset`, encoded just before it is sent);
    /// the run id sequence then continues after the highest id copied, so no id is ever handed
    /// out twice.
    package func restore(
        _ parts: @escaping @Sendable (_ write: @escaping SnapshotPartTaker) async throws -> Void
    ) async throws {
        let operation = "copy into \(location)"
        // Once the transaction is over: its runs' deadlines and sessions' expiries come due (``DueLook``).
        defer { dueWritten() }
        try await transaction(operation) { tx in
            let held =
                try await tx.queryOne(
                    """
                    SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM first_use),
                           (SELECT count(*) FROM sessions), (SELECT count(*) FROM facts)
                    """, []
                ) { [try $0.int64(0), try $0.int64(1), try $0.int64(2), try $0.int64(3)] } ?? []
            try StorageRules(location: self.location).checkEmptyTarget(counts: held, operation: operation)
            // Ended however this attempt ends: a part handed in later is refused.
            let copy = OpenCopy()
            defer { copy.end() }
            try await parts { part in
                guard copy.isOpen else {
                    throw HopError(
                        .refused, operation: operation, path: self.location, reason: "the copy's transaction is over",
                        hint: "Write every part before the function given to restore returns")
                }
                let insert = try SnapshotRows.statement(for: part)
                try await tx.run(insert.sql, [.text(insert.rows)])
            }
            try await tx.run("SELECT setval(pg_get_serial_sequence('runs', 'id'), (SELECT max(id) FROM runs))")
            try await tx.notifyChange()
        }
    }
}

/// An error thrown by the code a snapshot hands its parts to, on its way out of the snapshot's read.
private struct TakerError: Error {
    let error: any Error
}

/// A part's rows as one JSON array, the parameter of the statement of ``PostgresStore/restore(_:)``
/// that inserts them.
private enum SnapshotRows {
    /// The statement that inserts a part of this kind, and the part's rows as its parameter.
    static func statement(for part: SnapshotPart) throws -> (sql: String, rows: String) {
        switch part {
        case .runs(let runs):
            (
                """
                INSERT INTO runs (id, flow, subject, flow_version, status, current_step, current_token, wake_on,
                                  created_at, updated_at, wake_at)
                OVERRIDING SYSTEM VALUE
                SELECT id, flow, subject, flow_version, status, current_step, current_token, wake_on,
                       created_at, updated_at, wake_at
                FROM json_to_recordset($1::json) AS r(
                    id bigint, flow text, subject text, flow_version text, status text, current_step text,
                    current_token text, wake_on text, created_at bigint, updated_at bigint, wake_at bigint)
                """,
                try json(
                    runs.map {
                        RunRow(
                            id: $0.id, flow: $0.flow, subject: $0.subject, flow_version: $0.flowVersion,
                            status: $0.status.rawValue, current_step: $0.currentStep, current_token: $0.currentToken,
                            wake_on: $0.wakeOn?.rawValue, created_at: Clock.milliseconds($0.createdAt),
                            updated_at: Clock.milliseconds($0.updatedAt), wake_at: $0.wakeAt.map(Clock.milliseconds))
                    })
            )
        case .history(let entries):
            (
                """
                INSERT INTO history (run_id, seq, kind, step, token, value, at)
                SELECT run_id, seq, kind, step, token, value, at
                FROM json_to_recordset($1::json) AS h(
                    run_id bigint, seq bigint, kind text, step text, token text, value text, at bigint)
                """,
                try json(
                    entries.map {
                        HistoryRow(
                            run_id: $0.runID, seq: $0.seq, kind: $0.kind.rawValue, step: $0.step, token: $0.token,
                            value: $0.value, at: Clock.milliseconds($0.at))
                    })
            )
        case .firstUse(let flags):
            (
                """
                INSERT INTO first_use (subject, feature, used_at)
                SELECT subject, feature, used_at FROM json_to_recordset($1::json) AS f(
                    subject text, feature text, used_at bigint)
                """,
                try json(
                    flags.map {
                        FirstUseRow(
                            subject: $0.subject, feature: $0.flag.feature, used_at: Clock.milliseconds($0.flag.usedAt))
                    })
            )
        case .sessions(let sessions):
            (
                """
                INSERT INTO sessions (subject, user_id, token, created_at, expires_at)
                SELECT subject, user_id, token, created_at, expires_at FROM json_to_recordset($1::json) AS s(
                    subject text, user_id text, token text, created_at bigint, expires_at bigint)
                """,
                try json(
                    sessions.map {
                        SessionRow(
                            subject: $0.subject, user_id: $0.userID, token: $0.token,
                            created_at: Clock.milliseconds($0.createdAt),
                            expires_at: $0.expiresAt.map(Clock.milliseconds))
                    })
            )
        case .facts(let facts):
            (
                """
                INSERT INTO facts (subject, key, value, updated_at)
                SELECT subject, key, value, updated_at FROM json_to_recordset($1::json) AS f(
                    subject text, key text, value text, updated_at bigint)
                """,
                try json(
                    facts.map {
                        FactRow(
                            subject: $0.subject, key: $0.fact.key, value: $0.fact.value,
                            updated_at: Clock.milliseconds($0.fact.updatedAt))
                    })
            )
        }
    }

    private static func json(_ rows: some Encodable) throws -> String {
        String(decoding: try JSONEncoder().encode(rows), as: UTF8.self)
    }

    // The rows' JSON field names are the columns' names.
    // swift-format-ignore: AlwaysUseLowerCamelCase
    private struct RunRow: Encodable {
        let id: Int64, flow: String, subject: String, flow_version: String, status: String
        let current_step: String?, current_token: String?, wake_on: String?
        let created_at: Int64, updated_at: Int64, wake_at: Int64?
    }
    // swift-format-ignore: AlwaysUseLowerCamelCase
    private struct HistoryRow: Encodable {
        let run_id: Int64, seq: Int64, kind: String, step: String?, token: String?, value: String?, at: Int64
    }
    // swift-format-ignore: AlwaysUseLowerCamelCase
    private struct FirstUseRow: Encodable { let subject: String, feature: String, used_at: Int64 }
    // swift-format-ignore: AlwaysUseLowerCamelCase
    private struct SessionRow: Encodable {
        let subject: String, user_id: String, token: String, created_at: Int64, expires_at: Int64?
    }
    // swift-format-ignore: AlwaysUseLowerCamelCase
    private struct FactRow: Encodable { let subject: String, key: String, value: String, updated_at: Int64 }
}
