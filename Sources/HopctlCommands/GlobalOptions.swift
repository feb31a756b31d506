import ArgumentParser
import HopStore
import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Options every command that changes the database takes.
struct GlobalOptions: ParsableArguments {
    @Option(
        name: .long, help: ArgumentHelp("The Hop database: a file, or a postgres:// URL.", valueName: "path-or-url"))
    var db: String?

    @Option(
        name: .long, parsing: .unconditional,
        help: ArgumentHelp(
            "How long a write waits for a daemon's write lock, in milliseconds (0 to 600000).", valueName: "ms"))
    var busyTimeout: Int = 5000

    var path: String { db ?? DatabaseLocation.defaultPath() }

    func validate() throws {
        guard (0...600_000).contains(busyTimeout) else {
            throw ValidationError("--busy-timeout is out of range: give 0 to 600000 milliseconds")
        }
    }

    /// Opens the database for a change: it must exist; its schema is brought up to date.
    func openForWriting() async throws -> any HopAdministration {
        try await OpenDatabases.open(path, migrate: true) {
            try await HopStore.open(
                path: path,
                options: HopStore.Options(
                    busyTimeout: .milliseconds(busyTimeout), createIfMissing: false, migrate: true))
        }
    }
}

extension GlobalOptions {
    /// `arguments` with the options every command takes moved from before the command to its
    /// end, so that `hopctl --db PATH status` means `hopctl status --db PATH`.
    static func hoisted(_ arguments: [String]) -> [String] {
        var leading: [String] = []
        var rest = arguments[...]
        while let first = rest.first {
            if first == "--db" || first == "--busy-timeout", rest.count >= 2 {
                leading += rest.prefix(2)
                rest = rest.dropFirst(2)
            } else if first.hasPrefix("--db=") || first.hasPrefix("--busy-timeout=") {
                leading.append(first)
                rest = rest.dropFirst()
            } else {
                break
            }
        }
        guard !leading.isEmpty else { return arguments }
        // Reads never wait for a writer: a leading --busy-timeout (say, from a shell alias) does not apply to them.
        if let command = rest.first,
            readCommands.contains(command) || (command == "session" && rest.dropFirst().first == "show")
                || command == "first-use"
        {
            leading = Self.withoutBusyTimeout(leading)
        }
        // Before a `--` the options still belong to the command; after it nothing is parsed.
        if let separator = rest.firstIndex(of: "--") {
            return Array(rest[..<separator]) + leading + Array(rest[separator...])
        }
        return Array(rest) + leading
    }

    /// The commands that only read.
    static let readCommands: Set<String> = ["status", "history", "graph", "backup"]

    private static func withoutBusyTimeout(_ options: [String]) -> [String] {
        var kept: [String] = []
        var rest = options[...]
        while let first = rest.popFirst() {
            if first == "--busy-timeout" {
                _ = rest.popFirst()
            } else if !first.hasPrefix("--busy-timeout=") {
                kept.append(first)
            }
        }
        return kept
    }
}

/// Options every command that only reads takes: reads never wait for a writer, so they have no busy timeout.
struct ReadOptions: ParsableArguments {
    @Option(
        name: .long, help: ArgumentHelp("The Hop database: a file, or a postgres:// URL.", valueName: "path-or-url"))
    var db: String?

    /// Opens the database for reading: never creates or upgrades it.
    func openForReading() async throws -> any HopAdministration { try await Self.openForReading(db) }

    /// Opens the database `db` names (the default location when nil) for reading.
    static func openForReading(_ db: String?) async throws -> any HopAdministration {
        let path = db ?? DatabaseLocation.defaultPath()
        return try await OpenDatabases.open(path, migrate: false) {
            try await HopStore.open(path: path, options: HopStore.Options(createIfMissing: false, migrate: false))
        }
    }
}

/// The subject option, `default` unless given.
struct SubjectOption: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "The subject: whom the flows and stored state are for (a device, a user; default: default).",
            valueName: "subject"))
    var subject: String = Self.defaultSubject

    /// The subject of a daemon that serves one.
    static let defaultSubject = "default"

    func validate() throws { try checkIdentifier(subject, as: "subject") }
}

/// `--version V`, the name `start` and `fork` first gave `--flow-version`: still taken, no longer
/// shown. (Shown beside the `--version` flag every command has, it read as one option with two
/// meanings.)
struct FormerFlowVersionOption: ParsableArguments {
    @Option(name: .customLong("version"), help: ArgumentHelp(visibility: .private))
    var version: String?

    /// Refuses both spellings given with different versions.
    func check(besides flowVersion: String?) throws {
        if let version, let flowVersion, version != flowVersion {
            throw ValidationError("--version V is the former name of --flow-version: give one of them")
        }
    }
}

/// `--json` for read commands.
struct OutputOptions: ParsableArguments {
    @Flag(name: .long, help: "Print JSON (stable field names, documented in the README) instead of a table.")
    var json = false
}

/// Turns an identifier the store would refuse into a usage error (exit 64) before anything is opened.
func checkIdentifier(_ value: String, as what: String) throws {
    do {
        try Identifier.validate(value, as: what)
    } catch let error as HopError {
        throw ValidationError("\(error.reason). \(error.hint ?? "")")
    }
}

/// Turns a `--run` id that no run can have into a usage error (exit 64).
func checkRunID(_ run: Int64?) throws {
    if let run, run < 1 {
        throw ValidationError("--run is out of range: run ids are 1 or more (see `hopctl status`)")
    }
}

/// The databases a command opened: a file path opens a SQLite ``HopStore``; a `postgres://` URL
/// a server's database, through the opener the `hopctl-postgres` executable registers (`hopctl`
/// itself hands such a command line to it: see ``PostgresHandOff``), closed before hopctl exits.
package enum OpenDatabases {
    /// Opens a server's database (`url`, schema upgraded when `migrate`) and returns it with a way to close it.
    package typealias ServerOpener =
        @Sendable (_ url: String, _ migrate: Bool) async throws -> (
            store: any HopAdministration, close: @Sendable () async -> Void
        )

    private static let opener = Mutex<ServerOpener?>(nil)
    private static let closers = Mutex<[@Sendable () async -> Void]>([])

    /// Makes `postgres://` locations open with `open` (the `hopctl-postgres` executable does, at start).
    package static func register(_ open: @escaping ServerOpener) { opener.withLock { $0 = open } }

    /// Whether `location` names a server's database rather than a file.
    package static func isServerURL(_ location: String) -> Bool {
        location.hasPrefix("postgres://") || location.hasPrefix("postgresql://")
    }

    /// Opens `location`: a server's database when it is a `postgres://` URL (its schema upgraded
    /// when `migrate`, else an outdated one refused), else the file `openFile` opens.
    static func open(
        _ location: String, migrate: Bool, file openFile: () async throws -> HopStore
    ) async throws -> any HopAdministration {
        guard isServerURL(location) else { return try await openFile() }
        guard let open = opener.withLock({ $0 }) else {
            throw HopError(
                .invalidInput, operation: "open the database", path: "postgres://…",
                reason: "this hopctl cannot reach PostgreSQL: hopctl-postgres is not installed beside it",
                hint:
                    "Install hopctl-postgres (built with hopctl: swift build --product hopctl-postgres) in the same folder"
            )
        }
        let (store, close) = try await open(location, migrate)
        closers.withLock { $0.append(close) }
        return store
    }

    /// Closes the server connections opened so far.
    static func closeAll() async {
        for close in closers.withLock({ closers in
            defer { closers.removeAll() }
            return closers
        }) { await close() }
    }
}

/// The store of a command that only a SQLite file supports, or a clear refusal for a server's database.
func requireFile(_ store: any HopAdministration, for command: String, hint: String) throws -> HopStore {
    guard let file = store as? HopStore else {
        throw HopError(
            .refused, operation: command, path: store.location,
            reason: "`hopctl \(command)` works on a SQLite file; this database is on a PostgreSQL server", hint: hint)
    }
    return file
}
