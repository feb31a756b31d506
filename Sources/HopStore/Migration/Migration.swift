/// One numbered file of `Migrations/`, compiled into the binary by the EmbedMigrations plugin.
public struct Migration: Sendable, Equatable {
    /// The file's number: 1 for `0001_initial.sql`.
    public var version: Int
    /// The file's name after the number: `initial` for `0001_initial.sql`.
    public var name: String
    /// The file's SQL, verbatim.
    public var sql: String

    public init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
    }

    /// SHA-256 of the SQL text, as `sha256sum` prints it for the file.
    public var checksum: String { SHA256.hex(sql) }

    /// Every migration this binary carries, in version order.
    public static var all: [Migration] { embedded }

    /// The schema version this binary creates and expects.
    public static var latestVersion: Int { embedded.last?.version ?? 0 }
}
