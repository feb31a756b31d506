import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct Copy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "copy",
        abstract: "Copy a whole deployment into a new, empty database: from a SQLite file to PostgreSQL, or back.",
        discussion: """
            Copies every run with its history, the first-use flags, the stored sessions and the facts, \
            as one snapshot of --from, in one transaction into --to: all of it or nothing. --to must \
            hold no data: a file is created (or an empty one used); a server's database must exist, \
            and Hop's schema is created in it. Runs keep their ids and histories; no run is held by an \
            engine in the copy, so a daemon started on --to takes the running ones over and parked \
            ones wait for their unhop there. Stop the daemons on --from first: what they write after \
            the snapshot is not in the copy (hopctl warns when an engine held runs).
            """)

    @Option(help: ArgumentHelp("The database to copy: a file, or a postgres:// URL.", valueName: "path-or-url"))
    var from: String

    @Option(
        help: ArgumentHelp("The empty database to copy into: a file, or a postgres:// URL.", valueName: "path-or-url"))
    var to: String

    @OptionGroup var output: OutputOptions

    func validate() throws {
        if from == to { throw ValidationError("--from and --to name the same database: give a new, empty one as --to") }
    }

    func run() async throws {
        let source = try await OpenDatabases.open(from, migrate: false) {
            try await HopStore.open(path: from, options: HopStore.Options(createIfMissing: false, migrate: false))
        }
        let snapshot = try await source.snapshot()
        let created = !OpenDatabases.isServerURL(to) && !FileManager.default.fileExists(atPath: to)
        do {
            let target = try await OpenDatabases.open(to, migrate: true) {
                try await HopStore.open(path: to, options: HopStore.Options(createIfMissing: true, migrate: true))
            }
            try await target.restore(snapshot)
            let held = snapshot.runs.filter { $0.leaseIsLive(at: source.now()) }.count
            if held > 0 {
                Output.note(
                    "warning: \(held) run\(held == 1 ? " was" : "s were") held by a running engine when the snapshot was taken; what it does next is not in the copy (stop the daemons on --from before moving)"
                )
            }
            let report = CopyJSON(from: source.location, to: target.location, snapshot: snapshot)
            if output.json { return try Output.json(report) }
            Output.line(
                "copied \(report.runs) run\(report.runs == 1 ? "" : "s") (\(report.historyEntries) history entries), \(report.firstUseFlags) first-use flag\(report.firstUseFlags == 1 ? "" : "s"), \(report.sessions) session\(report.sessions == 1 ? "" : "s") and \(report.facts) fact\(report.facts == 1 ? "" : "s") from \(Output.printable(report.from)) to \(Output.printable(report.to))"
            )
        } catch {
            // A file this command created for a copy that failed is removed: nothing changed.
            if created {
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: to + suffix) }
            }
            throw error
        }
    }
}

/// `hopctl copy --json`.
struct CopyJSON: Encodable {
    let from: String
    let to: String
    let runs: Int
    let historyEntries: Int
    let firstUseFlags: Int
    let sessions: Int
    let facts: Int

    enum CodingKeys: String, CodingKey {
        case from, to, runs, sessions, facts
        case historyEntries = "history_entries"
        case firstUseFlags = "first_use_flags"
    }

    init(from: String, to: String, snapshot: HopSnapshot) {
        self.from = from
        self.to = to
        runs = snapshot.runs.count
        historyEntries = snapshot.history.count
        firstUseFlags = snapshot.firstUse.count
        sessions = snapshot.sessions.count
        facts = snapshot.facts.count
    }
}
