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

    /// Prints `run`'s history as it is now, read a page of `page` entries at a time: a run that
    /// went round a loop for years holds millions (held at once, about 450 bytes each in a table,
    /// 1 KiB in JSON). The text is the same as the whole history printed at once: a table gets its
    /// columns' widths from a first reading of every page, then prints them again page by page.
    /// `now` (the database's by default) is what the table's times are relative to.
    static func printWhole(
        _ run: RunRecord, json: Bool, in store: any HopAdministration, page: Int = entryPage, now: Date? = nil,
        write: @escaping (String) -> Void = { Output.line($0, terminator: "") }
    ) async throws {
        let now = now ?? store.now()
        let pages = try await HistoryPages(of: run, in: store, page: page)
        if pages.isWhole {
            return try await printAtOnce(run, pages.first, json: json, in: store, now: now, write: write)
        }
        if json {
            try await writeJSON(run, pages, depth: 0, in: store, write: write)
            return write("\n")
        }
        try await printTable(run, pages, now: now, write: write)
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

    /// Writes `run`'s history as the object ``HistoryJSON`` encodes to, a page at a time, for
    /// `depth` (0: the whole text; 1: an element of the array of `--all-runs`): its lines but the
    /// first indented two spaces a level, and no newline after it.
    private static func writeJSON(
        _ run: RunRecord, _ pages: HistoryPages, depth: Int, in store: any HopAdministration,
        write: @escaping (String) -> Void
    ) async throws {
        let indent = String(repeating: "  ", count: depth)
        let runJSON = try Output.jsonText(try await RunJSON.list([run], in: store)[0])
        write("{\n\(indent)  \"entries\" : ")
        var array = Output.JSONArray(depth: depth + 1, write: write)
        try await pages.eachPage { entries in
            for entry in entries { try array.append(HistoryJSON.Entry(entry)) }
        }
        array.finish()
        let lines = runJSON.split(separator: "\n", omittingEmptySubsequences: false)
        write(",\n\(indent)  \"run\" : " + lines.joined(separator: "\n\(indent)  ") + "\n\(indent)}")
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
        write(title(run) + "\n" + Output.tableText(tableHeaders, printableRows: rows(of: entries, now: now)))
    }

    /// ``printTable(_:_:now:write:)`` of a history read a page at a time: every page read once for
    /// the columns' widths, then again to print it.
    private static func printTable(
        _ run: RunRecord, _ pages: HistoryPages, now: Date, write: (String) -> Void
    ) async throws {
        var columns = Output.Columns(tableHeaders)
        try await pages.eachPage { columns.widen(for: rows(of: $0, now: now)) }
        write(title(run) + "\n" + columns.text(of: [tableHeaders]))
        try await pages.eachPage { write(columns.text(of: rows(of: $0, now: now))) }
    }

    /// The histories of every run of the flow, oldest first, read and printed `page` runs at a
    /// time (a flow of 1,000,000 runs took 8 GiB of memory in one read, 1.3 GiB as a table), their
    /// histories at most `batchEntries` entries at a time, and a run of more than `entryPage`
    /// entries on its own, a page at a time. `now` (the database's by default) is what the
    /// tables' times are relative to.
    func printAllRuns(
        _ store: any HopAdministration, entryPage: Int = Self.entryPage, batchEntries: Int = Self.batchEntries,
        now: Date? = nil, write: @escaping (String) -> Void = { Output.line($0, terminator: "") }
    ) async throws {
        try await requireFlow(flow, in: store, operation: "history")
        var array = json ? Output.JSONArray(write: write) : nil
        var after = Int64.min
        while true {
            let runs = try await store.allRuns(flow: flow, after: after, limit: Self.page)
            let lengths = try await store.historyLengths(runIDs: runs.map(\.id))
            var next = runs[...]
            while let run = next.first {
                if lengths[run.id, default: 0] > entryPage {
                    next = next.dropFirst()
                    let pages = try await HistoryPages(of: run, in: store, page: entryPage)
                    if array != nil {
                        try await array?.appendWritten { write in
                            try await Self.writeJSON(run, pages, depth: 1, in: store, write: write)
                        }
                    } else {
                        try await Self.printTable(run, pages, now: now ?? store.now(), write: write)
                    }
                    continue
                }
                // The runs up to the next long one, as many as hold `batchEntries` entries (one at least).
                var batch: [RunRecord] = []
                var held = 0
                while let run = next.first, case let length = Int(lengths[run.id, default: 0]), length <= entryPage,
                    batch.isEmpty || held + length <= batchEntries
                {
                    batch.append(run)
                    held += length
                    next = next.dropFirst()
                }
                let histories = try await store.histories(runIDs: batch.map(\.id))
                for run in batch {
                    let entries = histories[run.id] ?? []
                    if array != nil {
                        try array?.append(
                            HistoryJSON(
                                run: RunJSON(run, stepEntry: run.stepEntry(in: entries), now: store.now()),
                                entries: entries.map(HistoryJSON.Entry.init)))
                    } else {
                        Self.printTable(run, entries, now: now ?? store.now(), write: write)
                    }
                }
            }
            guard let last = runs.last, runs.count == Self.page else { break }
            after = last.id
        }
        array?.finish()
    }

    /// Runs read at a time by `--all-runs`.
    static let page = 1000

    /// History entries `--all-runs` reads at a time (of runs of at most ``entryPage`` entries).
    static let batchEntries = 50_000
}

/// A run's history read a page at a time, up to the entry that was its last when the first page
/// was read: entries recorded meanwhile are left for the next command.
struct HistoryPages {
    let run: RunRecord
    let store: any HopAdministration
    let page: Int
    /// The first page.
    let first: [HistoryEntry]
    /// The sequence number of the run's last entry when the first page was read: no page goes
    /// past it, so that both readings of a table see the same entries.
    private let last: Int64

    /// Reads the first page of `run`'s history.
    init(of run: RunRecord, in store: any HopAdministration, page: Int) async throws {
        self.run = run
        self.store = store
        self.page = page
        first = try await store.history(runID: run.id, after: .min, through: .max, limit: page)
        last =
            first.count < page
            ? first.last?.seq ?? 0 : try await store.history(runID: run.id, limit: 1).last?.seq ?? 0
    }

    /// Whether the first page holds the whole history.
    var isWhole: Bool { first.count < page }

    /// Hands `body` every page in turn, the first one again.
    /// - Throws: `.notFound` when the run was removed (pruned) before its last page was read.
    func eachPage(_ body: ([HistoryEntry]) throws -> Void) async throws {
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
}
