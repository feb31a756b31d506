#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Applies migrations in order, each in its own transaction, recording version, name,
/// checksum and time in `hop_migrations`.
///
/// Safe for several processes opening one fresh file at once: each migration re-checks,
/// under the write lock, whether another process applied it meanwhile.
enum Migrator {
    struct Applied {
        var version: Int
        var name: String
        var checksum: String
    }

    private static let createTable = """
        CREATE TABLE IF NOT EXISTS hop_migrations (
            version    INTEGER PRIMARY KEY,
            name       TEXT    NOT NULL,
            checksum   TEXT    NOT NULL,
            applied_at INTEGER NOT NULL
        )
        """

    /// Brings the schema up to the last of `migrations`; returns the schema version.
    static func migrate(_ connection: Connection, migrations: [Migration]) throws -> Int {
        // A database that is already current (every open but the first) is checked in a read
        // transaction: opening it never waits for, nor holds up, another process's writes.
        let current = try appliedVersion(connection, migrations: migrations)
        if current == migrations.last?.version ?? 0 { return current }
        let applied = try connection.write("migrate") {
            try connection.execute(createTable, operation: "migrate")
            return try check(connection, migrations: migrations)
        }
        var version = applied.map(\.version).max() ?? 0
        for migration in migrations where migration.version > version {
            try connection.write("apply migration \(migration.version) (\(migration.name))") {
                let current = try check(connection, migrations: migrations).map(\.version).max() ?? 0
                guard current < migration.version else { return }
                try connection.execute(
                    migration.sql, operation: "apply migration \(migration.version) (\(migration.name))")
                try connection.run(
                    "INSERT INTO hop_migrations (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
                    [
                        .integer(Int64(migration.version)), .text(migration.name), .text(migration.checksum),
                        .integer(Clock.nowMilliseconds()),
                    ],
                    operation: "record migration \(migration.version)")
            }
            version = migration.version
        }
        return version
    }

    /// The applied schema version, its migrations checked against `migrations` (0 when the file
    /// holds no Hop schema yet), read in a read transaction.
    private static func appliedVersion(_ connection: Connection, migrations: [Migration]) throws -> Int {
        try connection.read("check schema") {
            let exists =
                try connection.queryOne(
                    "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'hop_migrations'", [],
                    operation: "check schema"
                ) { _ in true } ?? false
            return exists ? (try check(connection, migrations: migrations).map(\.version).max() ?? 0) : 0
        }
    }

    /// Verifies the applied migrations against `migrations` without changing anything; returns the schema version.
    static func verify(_ connection: Connection, migrations: [Migration]) throws -> Int {
        let version = try appliedVersion(connection, migrations: migrations)
        let latest = migrations.last?.version ?? 0
        if version < latest {
            throw HopError(
                .schemaOutdated, operation: "check schema", path: connection.path,
                reason: version == 0
                    ? "the file holds no Hop schema yet"
                    : "the database has schema version \(version), this binary needs \(latest)",
                hint: "Run `hopctl migrate` (or start the daemon) to create or upgrade it")
        }
        return version
    }

    private static func check(_ connection: Connection, migrations: [Migration]) throws -> [Applied] {
        let applied = try connection.query(
            "SELECT version, name, checksum FROM hop_migrations ORDER BY version", [], operation: "read migrations"
        ) { Applied(version: Int($0.int64(0)), name: $0.text(1), checksum: $0.text(2)) }
        try StorageRules(location: connection.path).checkApplied(
            applied.map { ($0.version, $0.name, $0.checksum) }, against: migrations)
        return applied
    }
}

extension HopStore {
    /// The migrations applied to this database, in order.
    public func appliedMigrations() throws -> [(version: Int, name: String, checksum: String, appliedAt: Date)] {
        try connection.query(
            "SELECT version, name, checksum, applied_at FROM hop_migrations ORDER BY version", [],
            operation: "read migrations"
        ) { (Int($0.int64(0)), $0.text(1), $0.text(2), Clock.date($0.int64(3))) }
    }
}
