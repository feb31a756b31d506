import Foundation
import HopStore
import Logging
import PostgresNIO

/// The PostgreSQL migrations compiled into this binary (`Migrations/postgres/`), in version order.
public enum PostgresMigrations {
    public static var all: [Migration] { Migration.postgresEmbedded }
    public static var latestVersion: Int { Migration.postgresEmbedded.last?.version ?? 0 }
}

/// Creates and upgrades Hop's schema on PostgreSQL, as the SQLite store's migrator does on a
/// file: numbered migrations applied in order, each in one transaction with its record in
/// `hop_migrations`; an applied migration whose text changed (its checksum) is refused, and so is
/// a schema newer than this binary. Engines opening one database at once take turns (a
/// transaction-level advisory lock), so each migration is applied exactly once.
struct PostgresMigrator {
    let client: PostgresClient
    let location: String
    let logger: Logger
    var migrations: [Migration] = PostgresMigrations.all

    /// The key of the advisory lock migrators take turns on ("hopmigr" in ASCII).
    static let lockKey: Int64 = 0x686f_706d_6967_72

    /// Applies the missing migrations (with `migrate`) or checks that none is missing; returns the schema version.
    func run(migrate: Bool) async throws -> Int {
        let latest = migrations.last?.version ?? 0
        let current = try await appliedVersion()
        if current == latest { return current }
        guard migrate else {
            throw HopError(
                .schemaOutdated, operation: "check schema", path: location,
                reason: current == 0
                    ? "the database holds no Hop schema yet"
                    : "the database has schema version \(current), this binary needs \(latest)",
                hint: "Run `hopctl migrate --db URL` (or start the daemon) to create or upgrade it")
        }
        var version = current
        for migration in migrations where migration.version > version {
            let operation = "apply migration \(migration.version) (\(migration.name))"
            do {
                try await client.withWatchedConnection { connection in
                    try await connection.withTransaction(logger: logger) { connection in
                        try await Self.execute(
                            "SELECT pg_advisory_xact_lock($1)", [.int(Self.lockKey)], on: connection, logger: logger)
                        try await Self.execute(Self.createTable, [], on: connection, logger: logger)
                        guard try await check(on: connection) < migration.version else { return }
                        for statement in Self.statements(of: migration.sql) {
                            try await Self.execute(statement, [], on: connection, logger: logger)
                        }
                        try await Self.execute(
                            "INSERT INTO hop_migrations (version, name, checksum, applied_at) VALUES ($1, $2, $3, $4)",
                            [
                                .int(Int64(migration.version)), .text(migration.name), .text(migration.checksum),
                                .int(Clock.nowMilliseconds()),
                            ], on: connection, logger: logger)
                    }
                }
            } catch {
                throw PostgresStore.map(error, operation: operation, location: location)
            }
            version = migration.version
        }
        return version
    }

    private static let createTable = """
        CREATE TABLE IF NOT EXISTS hop_migrations (
            version    INTEGER PRIMARY KEY,
            name       TEXT    NOT NULL,
            checksum   TEXT    NOT NULL,
            applied_at BIGINT  NOT NULL
        )
        """

    /// The newest applied version (0 for an empty database), after checking what is applied.
    private func appliedVersion() async throws -> Int {
        do {
            return try await client.withWatchedConnection { connection in
                let exists =
                    try await connection.query(
                        "SELECT to_regclass('hop_migrations') IS NOT NULL", logger: logger
                    ).collect().first.map { try Row($0).bool(0) } ?? false
                guard exists else { return 0 }
                return try await check(on: connection)
            }
        } catch {
            throw PostgresStore.map(error, operation: "check schema", location: location)
        }
    }

    /// The newest applied migration's version (0 for none), after refusing a schema newer than
    /// this binary and an edited migration.
    private func check(on connection: PostgresConnection) async throws -> Int {
        let applied = try await connection.query(
            "SELECT version, name, checksum FROM hop_migrations ORDER BY version", logger: logger
        ).collect().map { row in
            let row = Row(row)
            return (version: Int(try row.int64Column(0)), name: try row.text(1), checksum: try row.text(2))
        }
        try StorageRules(location: location).checkApplied(applied, against: migrations)
        return applied.map(\.version).max() ?? 0
    }

    private static func execute(
        _ sql: String, _ values: [PostgresValue], on connection: PostgresConnection, logger: Logger
    ) async throws {
        _ = try await connection.query(PostgresValue.query(sql, values), logger: logger).collect()
    }

    /// The statements of a migration file, one by one (the extended protocol takes one per
    /// message): split at the semicolons outside quotes and comments, comments dropped.
    static func statements(of sql: String) -> [String] {
        var statements: [String] = []
        var current = ""
        var characters = Array(sql)[...]
        var quote: Character?
        while let character = characters.popFirst() {
            if let open = quote {
                current.append(character)
                if character == open { quote = nil }
            } else if character == "-", characters.first == "-" {
                while let next = characters.first, next != "\n" { characters.removeFirst() }
            } else if character == "'" || character == "\"" {
                quote = character
                current.append(character)
            } else if character == ";" {
                statements.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        statements.append(current)
        return statements.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }.filter { !$0.isEmpty }
    }
}

extension Row {
    /// An INTEGER (32-bit) or BIGINT column as a 64-bit number.
    func int64Column(_ index: Int) throws -> Int64 {
        if let value = try? cells[index].decode(Int32.self) { return Int64(value) }
        return try int64(index)
    }
}
