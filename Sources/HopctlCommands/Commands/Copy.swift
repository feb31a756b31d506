import ArgumentParser
import HopStore
import Synchronization

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
            as one snapshot of --from, in one transaction into --to: all of it or nothing, a few \
            thousand rows held at a time whatever the size of the deployment. --to must \
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
        let created = !OpenDatabases.isServerURL(to) && !FileManager.default.fileExists(atPath: to)
        do {
            let target = try await OpenDatabases.open(to, migrate: true) {
                try await HopStore.open(path: to, options: HopStore.Options(createIfMissing: true, migrate: true))
            }
            // The snapshot goes part by part from --from's read into --to's transaction: a few
            // thousand rows held at a time, whatever the size of the deployment.
            // The target's transaction may start again, and the read with it (a server's connection
            // lost): what is reported is what the attempt that read everything counted.
            let moved = Counted()
            let now = source.now()
            try await target.restore { write in
                let counted = Counted()
                try await source.snapshot { part in
                    counted.add(part, now: now)
                    try await write(part)
                }
                moved.set(counted.counts)
            }
            let counts = moved.counts
            if counts.held > 0 {
                Output.note(
                    "warning: \(counts.held) run\(counts.held == 1 ? " was" : "s were") held by a running engine when the snapshot was taken; what it does next is not in the copy (stop the daemons on --from before moving)"
                )
            }
            let report = CopyJSON(from: source.location, to: target.location, counts: counts)
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

    init(from: String, to: String, counts: Counted.Counts) {
        self.from = from
        self.to = to
        runs = counts.runs
        historyEntries = counts.historyEntries
        firstUseFlags = counts.firstUseFlags
        sessions = counts.sessions
        facts = counts.facts
    }
}

/// What a copy moved, counted part by part as the parts go by.
final class Counted: Sendable {
    struct Counts {
        var runs = 0
        var historyEntries = 0
        var firstUseFlags = 0
        var sessions = 0
        var facts = 0
        /// The runs whose lease was live in the snapshot: held by an engine of the source.
        var held = 0
    }

    private let state = Mutex(Counts())

    var counts: Counts { state.withLock { $0 } }

    /// Takes `counts` as its own.
    func set(_ counts: Counts) { state.withLock { $0 = counts } }

    /// Counts the rows of `part`, and its runs' leases live at `now`.
    func add(_ part: SnapshotPart, now: Date) {
        state.withLock { counts in
            switch part {
            case .runs(let runs):
                counts.runs += runs.count
                counts.held += runs.count { $0.leaseIsLive(at: now) }
            case .history(let entries): counts.historyEntries += entries.count
            case .firstUse(let flags): counts.firstUseFlags += flags.count
            case .sessions(let sessions): counts.sessions += sessions.count
            case .facts(let facts): counts.facts += facts.count
            }
        }
    }
}
