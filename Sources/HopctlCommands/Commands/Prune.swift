import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct Prune: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prune",
        abstract: "Delete finished runs and their history, in short transactions beside running daemons.",
        discussion: """
            Removes the runs (completed, cancelled, failed, diverged) whose last change is older than \
            --finished-before, except the --keep-last newest runs of each flow and subject, looking \
            at 10,000 runs and removing at most 500 per transaction, each a few milliseconds: a \
            daemon beside it writes between them, within its busy timeout. Unfinished runs, \
            first-use flags and sessions are never removed. A database created by Hop 0.2.0 or later \
            gives the freed space back to the file system as it goes; an older one reuses it for new \
            runs, and --vacuum rewrites it once so that it gives the space back from then on (the \
            rewrite holds the write lock: daemons wait for it, up to their busy timeout). `hopctl \
            graph` and `hopctl patches` count only the runs that are left.
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var output: OutputOptions

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Remove runs that finished longer ago than this (a number followed by s, m, h or d, e.g. 30d).",
            valueName: "age"))
    var finishedBefore: String

    @Option(help: ArgumentHelp("Only runs of this flow.", valueName: "flow"))
    var flow: String?

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp("Keep the newest N runs of each flow and subject, however old.", valueName: "n"))
    var keepLast = 1

    @Flag(help: "Count what would be removed; change nothing.")
    var dryRun = false

    @Flag(help: "Then rewrite the database so that it gives the freed space back (holds the write lock meanwhile).")
    var vacuum = false

    func validate() throws {
        guard let seconds = DurationText.seconds(finishedBefore) else {
            throw ValidationError(
                "--finished-before is not a duration: write a number followed by s, m, h or d (e.g. 30d)")
        }
        guard seconds >= 0, seconds <= DurationText.maximum else {
            throw ValidationError("--finished-before is out of range: give 0s to 100 years (e.g. 30d)")
        }
        guard keepLast >= 0, keepLast <= 1_000_000 else {
            throw ValidationError("--keep-last is out of range: give 0 to 1000000")
        }
        if let flow { try checkIdentifier(flow, as: "flow name") }
        if dryRun && vacuum { throw ValidationError("--dry-run changes nothing: leave out --vacuum") }
    }

    func run() async throws {
        let store = try await global.openForWriting()
        let cutoff = store.now().addingTimeInterval(-(DurationText.seconds(finishedBefore) ?? 0))
        // Refused before anything is pruned: a server's database has no file to rewrite.
        let file =
            vacuum
            ? try requireFile(
                store, for: "prune --vacuum",
                hint: "PostgreSQL's autovacuum reuses the space of pruned runs; prune without --vacuum") : nil
        var report = try await store.prune(
            Pruning(finishedBefore: cutoff, flow: flow, keepLast: keepLast), dryRun: dryRun)
        if let file { report.reclaimedBytes += try await file.vacuum() }
        if let flow, report.runs == 0 {
            // Not an error: a scheduled prune of a flow whose runs are all gone is not one. But a
            // mistyped name must not read as "nothing was old enough".
            let flows = try await store.flowNames()
            if !flows.contains(flow) {
                let here =
                    flows.isEmpty ? "no flow has run here yet" : "the flows here: \(flows.joined(separator: ", "))"
                Output.note("note: no run of flow '\(flow)' is stored here (\(here)); check the flow's name")
            }
        }
        if output.json { return try Output.json(PruneJSON(report, cutoff: cutoff, dryRun: dryRun)) }
        let runs = "\(report.runs) run\(report.runs == 1 ? "" : "s") (\(report.historyEntries) history entries)"
        let cutoffText = cutoff.formatted(.iso8601)
        if dryRun {
            return Output.line("would prune \(runs) that finished before \(cutoffText); nothing was changed")
        }
        let transactions = "\(report.batches) transaction\(report.batches == 1 ? "" : "s")"
        guard store is HopStore else {
            // A server's database: no file to give space back from.
            return Output.line(
                "pruned \(runs) that finished before \(cutoffText), in \(transactions); the server's autovacuum makes their space reusable"
            )
        }
        Output.line(
            "pruned \(runs) that finished before \(cutoffText), in \(transactions); \(report.reclaimedBytes) bytes given back to the file system"
        )
        if vacuum {
            Output.line(
                "rewrote the database in incremental auto-vacuum mode: later prunes give the space back as they go")
        } else if report.runs > 0 && !report.reclaimsIncrementally {
            Output.line(
                "this database was created before Hop gave freed space back as it goes: new runs reuse it; `hopctl prune --vacuum` rewrites the database once to give it back (daemons wait meanwhile)"
            )
        }
    }
}

/// `hopctl prune --json`.
struct PruneJSON: Encodable {
    let runs: Int
    let historyEntries: Int
    let batches: Int
    let reclaimedBytes: Int64
    let finishedBefore: Date
    let dryRun: Bool

    enum CodingKeys: String, CodingKey {
        case runs, batches
        case historyEntries = "history_entries"
        case reclaimedBytes = "reclaimed_bytes"
        case finishedBefore = "finished_before"
        case dryRun = "dry_run"
    }

    init(_ report: PruneReport, cutoff: Date, dryRun: Bool) {
        runs = report.runs
        historyEntries = report.historyEntries
        batches = report.batches
        reclaimedBytes = report.reclaimedBytes
        finishedBefore = cutoff
        self.dryRun = dryRun
    }
}
