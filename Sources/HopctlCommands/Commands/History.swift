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
        if let limit {
            let entries = try await store.history(runID: record.id, limit: limit)
            return try await Self.printAtOnce(record, entries, json: json, in: store, now: store.now())
        }
        try await Self.printWhole(record, json: json, in: store)
    }

    /// Prints `run`'s history as it is now. Read a page of `page` entries at a time: a run that
    /// went round a loop for years holds millions (held at once, about 450 bytes each in a table, 1 KiB
    /// in JSON). The text is the same as the whole history printed at once: a table gets its
    /// columns' widths from a first reading of every page, then prints them again page by page.
    /// `now` (the database's by default) is what the table's times are relative to.
    static func printWhole(
        _ run: RunRecord, json: Bool, in store: any HopAdministration, page: Int = entryPage, now: Date? = nil,
        write: @escaping (String) -> Void = { Output.line($0, terminator: "") }
    ) async throws {
        let now = now ?? store.now()
        let first = try await store.history(runID: run.id, after: .min, through: .max, limit: page)
        guard first.count == page, let last = try await store.history(runID: run.id, limit: 1).last?.seq else {
            return try await printAtOnce(run, first, json: json, in: store, now: now, write: write)
        }
        // Every page up to the last entry there is now, again on the second reading: entries
        // recorded meanwhile are left for the next command.
        func forEachPage(_ body: ([HistoryEntry]) throws -> Void) async throws {
            var entries = first
            while true {
                try body(entries)
                guard let end = entries.last?.seq, end < last else { return }
                entries = try await store.history(runID: run.id, after: end, through: last, limit: page)
                guard !entries.isEmpty else {
                    throw HopError(
                        .notFound, operation: "history", path: store.location,
                        reason: "run \(run.id) was removed while its history was read (a prune)",
                        hint: "List runs with `hopctl status --flow \(run.flow)`")
                }
            }
        }
        if json {
            let runJSON = try Output.jsonText(try await RunJSON.list([run], in: store)[0])
            write("{\n  \"entries\" : ")
            var array = Output.JSONArray(depth: 1, write: write)
            try await forEachPage { entries in
                for entry in entries { try array.append(HistoryJSON.Entry(entry)) }
            }
            array.finish()
            let indented = runJSON.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\n  ")
            write(",\n  \"run\" : " + indented + "\n}\n")
            return
        }
        var columns = Output.Columns(tableHeaders)
        try await forEachPage { columns.widen(for: rows(of: $0, now: now)) }
        write(title(run) + "\n" + columns.text(of: [tableHeaders]))
        try await forEachPage { write(columns.text(of: rows(of: $0, now: now))) }
    }

    /// Prints `run` and `entries`, all of them at once.
    private static func printAtOnce(
        _ run: RunRecord, _ entries: [HistoryEntry], json: Bool, in store: any HopAdministration, now: Date,
        write: (String) -> Void = { Output.line($0, terminator: "") }
    ) async throws {
        if json {
            let history = HistoryJSON(
                run: try await RunJSON.list([run], in: store)[0], entries: entries.map(HistoryJSON.Entry.init))
            return write(try Output.jsonText(history) + "\n")
        }
        printTable(run, entries, now: now, write: write)
    }

    /// Entries of one run read at a time by ``printWhole(_:json:in:page:now:write:)``.
    static let entryPage = 5000

    private static let tableHeaders = ["SEQ", "KIND", "STEP", "VALUE", "AT"]

    /// The line that names a run above its table.
    private static func title(_ run: RunRecord) -> String {
        "run \(run.id) of \(Output.printable(run.flow)) for \(Output.printable(run.subject)): \(run.status.rawValue)"
    }

    /// `entries` as the table's rows, each cell printable.
    private static func rows(of entries: [HistoryEntry], now: Date) -> [[String]] {
        entries.map {
            [
                "\($0.seq)", $0.kind.rawValue, $0.step ?? "-", Output.abbreviated($0.value ?? ""),
                Output.relative($0.at, now: now),
            ].map(Output.printable)
        }
    }

    /// One run's history for people: a line naming the run, then a table of its entries.
    private static func printTable(
        _ run: RunRecord, _ entries: [HistoryEntry], now: Date,
        write: (String) -> Void = { Output.line($0, terminator: "") }
    ) {
        var columns = Output.Columns(tableHeaders)
        let rows = rows(of: entries, now: now)
        columns.widen(for: rows)
        write(title(run) + "\n" + columns.text(of: [tableHeaders] + rows))
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
