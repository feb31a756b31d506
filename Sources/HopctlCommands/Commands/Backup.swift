import ArgumentParser
import HopStore

struct Backup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Write a consistent, checked copy of the database to a new file, while daemons run.",
        discussion: """
            The copy is one snapshot of the database (SQLite's VACUUM INTO), private (mode 0600), \
            flushed to disk and checked (integrity_check) before this says it is done; daemons go on \
            writing meanwhile. To restore: stop the daemon, replace its database file with the copy \
            (and remove the old file's -wal and -shm files), start it: its runs resume from the copy.
            """)

    @OptionGroup var global: ReadOptions
    @OptionGroup var output: OutputOptions

    @Argument(help: ArgumentHelp("The new file to write (an existing file is never overwritten).", valueName: "path"))
    var path: String

    func run() async throws {
        let store = try requireFile(
            try await global.openForReading(), for: "backup",
            hint:
                "Back a server's database up with PostgreSQL's own tools (pg_dump, pg_basebackup); `hopctl copy --to FILE` writes it into a new SQLite file"
        )
        let backup = try await store.backup(to: path)
        if output.json { return try Output.json(BackupJSON(backup)) }
        Output.line(
            "backed up \(backup.runs) runs (schema \(backup.schemaVersion), \(backup.bytes) bytes) to \(Output.printable(backup.path)); integrity_check ok"
        )
    }
}

/// `hopctl backup --json`.
struct BackupJSON: Encodable {
    let path: String
    let bytes: Int64
    let runs: Int
    let schemaVersion: Int

    enum CodingKeys: String, CodingKey {
        case path, bytes, runs
        case schemaVersion = "schema_version"
    }

    init(_ backup: HopStore.Backup) {
        path = backup.path
        bytes = backup.bytes
        runs = backup.runs
        schemaVersion = backup.schemaVersion
    }
}
