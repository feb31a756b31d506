import CSQLite
import Foundation
import HopStore
import HopStoreTestSupport
import Testing

/// The PostgreSQL schema (`Migrations/postgres/`), the first brick of the PostgreSQL backend
/// (issue 18), applied on a server the test starts itself: it must hold what the SQLite schema
/// holds, table for table, column for column, index for index, and refuse what it refuses.
@Suite struct PostgresSchemaTests {
    static let migrations = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Migrations/postgres")

    /// A server with database `hop` holding the PostgreSQL schema; `nil` where PostgreSQL is
    /// missing outside CI (said once on standard error).
    func serverWithSchema() async throws -> PostgresServer? {
        guard let server = try await PostgresServer.start() else { return nil }
        try await server.createDatabase("hop")
        let files = try FileManager.default.contentsOfDirectory(atPath: Self.migrations.path)
            .filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files.first == "0001_initial.sql")
        for file in files {
            try await server.psql(file: Self.migrations.appendingPathComponent(file).path, database: "hop")
        }
        return server
    }

    /// Rows of `sql` on the SQLite database at `path`, each row's columns joined by `|`.
    func sqliteRows(_ path: String, _ sql: String) throws -> [String] {
        var db: OpaquePointer?
        defer { sqlite3_close(db) }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        // The store that made the file may still be closing it (its last connection checkpoints
        // the log under an exclusive lock): wait for it as the store's own connections do.
        guard sqlite3_open(path, &db) == SQLITE_OK, sqlite3_busy_timeout(db, 5_000) == SQLITE_OK,
            sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK
        else {
            throw TestFailure("SQLite: \(String(cString: sqlite3_errmsg(db)))")
        }
        var rows: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            rows.append(
                (0..<sqlite3_column_count(statement)).map { column in
                    sqlite3_column_text(statement, column).map { String(cString: $0) } ?? ""
                }.joined(separator: "|"))
        }
        return rows
    }

    @Test func theSchemaHasEveryTableColumnAndIndexOfTheSQLiteSchema() async throws {
        guard let server = try await serverWithSchema() else { return }
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)  // the SQLite schema, every migration applied

        let sqliteColumns = try sqliteRows(
            folder.database,
            """
            SELECT m.name, p.name FROM sqlite_schema m, pragma_table_info(m.name) p
            WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name <> 'hop_migrations'
            """)
        let postgresColumns = try await server.psql(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'",
            database: "hop"
        ).split(separator: "\n").map(String.init)
        #expect(!sqliteColumns.isEmpty)
        // A file's leases and deadlines by the machine's uptime clock, in a boot: a
        // server measures them by its own clock.
        let sqliteOnly: Set = [
            "runs|lease_boot", "runs|wake_boot", "runs|wake_uptime", "history|deadline_boot", "history|deadline_uptime",
        ]
        #expect(sqliteOnly.isSubset(of: sqliteColumns))
        // When an engine first found each start of the server answering: a file has no server.
        let postgresOnly: Set = ["server_starts|started_at", "server_starts|first_seen_at"]
        #expect(postgresOnly.isSubset(of: postgresColumns))
        #expect(Set(postgresColumns) == Set(sqliteColumns).subtracting(sqliteOnly).union(postgresOnly))

        let sqliteIndexes = try sqliteRows(
            folder.database,
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%'")
        let postgresIndexes = try await server.psql(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND indexname NOT LIKE '%_pkey'",
            database: "hop"
        ).split(separator: "\n").map(String.init)
        #expect(!sqliteIndexes.isEmpty)
        let sqliteOnlyIndexes: Set = ["runs_by_wake_uptime"]
        #expect(sqliteOnlyIndexes.isSubset(of: sqliteIndexes))
        #expect(Set(postgresIndexes) == Set(sqliteIndexes).subtracting(sqliteOnlyIndexes))
    }

    @Test func theSchemaAcceptsEveryKindAndStatusTheStoreWritesAndRefusesOthers() async throws {
        guard let server = try await serverWithSchema() else { return }
        for (index, status) in RunStatus.allCases.enumerated() {
            try await server.psql(
                """
                INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
                VALUES ('startup', 'device-\(index)', '1', '\(status.rawValue)', 0, 0)
                """, database: "hop")
        }
        let run = try await server.psql("SELECT min(id) FROM runs", database: "hop")
            .trimmingCharacters(in: .whitespacesAndNewlines)
        for (seq, kind) in HistoryKind.allCases.enumerated() {
            try await server.psql(
                "INSERT INTO history (run_id, seq, kind, at) VALUES (\(run), \(seq + 1), '\(kind.rawValue)', 0)",
                database: "hop")
        }
        await #expect(throws: TestFailure.self) {
            try await server.psql(
                "INSERT INTO history (run_id, seq, kind, at) VALUES (\(run), 1000, 'bogus', 0)", database: "hop")
        }
        // At most one unfinished run per flow and subject, as on SQLite (device-0's run is running).
        #expect(RunStatus.allCases.first == .running)
        await #expect(throws: TestFailure.self) {
            try await server.psql(
                """
                INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
                VALUES ('startup', 'device-0', '1', 'parked', 0, 0)
                """, database: "hop")
        }
        // A run's history goes with it.
        try await server.psql("DELETE FROM runs WHERE id = \(run)", database: "hop")
        #expect(try await server.psql("SELECT count(*) FROM history", database: "hop").hasPrefix("0"))
    }
}
