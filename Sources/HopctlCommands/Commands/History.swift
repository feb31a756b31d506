import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct History: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "A run's hop history in order (the latest run of the flow for the subject by default).",
        discussion: """
            With --all-runs, the histories of every run of the flow, for every subject, oldest first: \
            with --json, the file a replay test reads (HopTesting's HistoryReplayer).
            """)

    @OptionGroup var global: ReadOptions
    @OptionGroup var subjectOption: SubjectOption
    @OptionGroup var output: OutputOptions

    @Option(help: ArgumentHelp("The flow.", valueName: "flow"))
    var flow: String

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp("A run id (see `hopctl status`) instead of the latest run.", valueName: "id"))
    var run: Int64?

    @Option(parsing: .unconditional, help: ArgumentHelp("Only the last N entries (1 or more).", valueName: "n"))
    var limit: Int?

    @Flag(help: "Every run of the flow, for every subject, oldest first (no --run, --subject or --limit).")
    var allRuns = false

    /// What was asked, for ``HistoryRequest`` to answer.
    var request: HistoryRequest {
        HistoryRequest(
            db: global.db, json: output.json, subject: subjectOption.subject, flow: flow, run: run, limit: limit,
            allRuns: allRuns)
    }

    func validate() throws { try request.validate() }

    func run() async throws { try await request.run() }
}

/// What `hopctl history` was asked, from ``History`` or from ``QuickCommandLine``, and how it is answered.
struct HistoryRequest: Equatable {
    var db: String?
    var json: Bool
    var subject: String
    var flow: String
    var run: Int64?
    var limit: Int?
    var allRuns: Bool

    func validate() throws {
        try checkIdentifier(flow, as: "flow name")
        try checkIdentifier(subject, as: "subject")
        if let limit, limit < 1 { throw ValidationError("--limit is out of range: give 1 or more entries") }
        try checkRunID(run)
        if allRuns, run != nil || limit != nil || subject != SubjectOption.defaultSubject {
            throw ValidationError("--all-runs takes every run of the flow: give it without --run, --subject or --limit")
        }
    }

    func run() async throws {
        let store = try await ReadOptions.openForReading(db)
        if allRuns { return try await printAllRuns(store) }
        let record: RunRecord?
        if let run {
            record = try await store.run(id: run)
            if let record, record.flow != flow || record.subject != subject {
                throw HopError(
                    .notFound, operation: "history", path: store.location,
                    reason:
                        "run \(run) belongs to flow '\(record.flow)' for subject '\(record.subject)', not '\(flow)' for '\(subject)'",
                    hint: "Pass the matching --flow and --subject")
            }
        } else {
            record = try await store.latestRun(flow: flow, subject: subject)
        }
        guard let record else {
            if run == nil { try await requireFlow(flow, in: store, operation: "history") }
            throw HopError(
                .notFound, operation: "history", path: store.location,
                reason: run.map { "there is no run \($0)" }
                    ?? "there is no run of flow '\(flow)' for subject '\(subject)'",
                hint: "List runs with `hopctl status --flow \(flow)`")
        }
        let entries = try await store.history(runID: record.id, limit: limit)
        if json {
            return try Output.json(
                HistoryJSON(
                    run: try await RunJSON.list([record], in: store)[0],
                    entries: entries.map(HistoryJSON.Entry.init)))
        }
        Self.printTable(record, entries, now: store.now())
    }

    /// One run's history for people: a line naming the run, then a table of its entries.
    private static func printTable(_ run: RunRecord, _ entries: [HistoryEntry], now: Date) {
        Output.line(
            "run \(run.id) of \(Output.printable(run.flow)) for \(Output.printable(run.subject)): \(run.status.rawValue)"
        )
        Output.table(
            ["SEQ", "KIND", "STEP", "VALUE", "AT"],
            entries.map {
                [
                    "\($0.seq)", $0.kind.rawValue, $0.step ?? "-", Output.abbreviated($0.value ?? ""),
                    Output.relative($0.at, now: now),
                ]
            })
    }

    /// The histories of every run of the flow, oldest first, read and printed `page` runs at a
    /// time: a flow of 1,000,000 runs took 8 GiB of memory in one read (1.3 GiB as a table).
    private func printAllRuns(_ store: any HopAdministration) async throws {
        try await requireFlow(flow, in: store, operation: "history")
        var array = json ? Output.JSONArray() : nil
        var after = Int64.min
        while true {
            let runs = try await store.allRuns(flow: flow, after: after, limit: Self.page)
            let histories = try await store.histories(runIDs: runs.map(\.id))
            for run in runs {
                let entries = histories[run.id] ?? []
                if array != nil {
                    try array?.append(
                        HistoryJSON(
                            run: RunJSON(run, stepEntry: run.stepEntry(in: entries), now: store.now()),
                            entries: entries.map(HistoryJSON.Entry.init)))
                } else {
                    Self.printTable(run, entries, now: store.now())
                }
            }
            guard let last = runs.last, runs.count == Self.page else { break }
            after = last.id
        }
        array?.finish()
    }

    /// Runs read at a time by `--all-runs`.
    static let page = 1000
}
