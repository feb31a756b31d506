#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Reading runs and their histories: what `hopctl` shows and what an engine replays.
extension HopStore {
    // MARK: Reading runs

    /// The run with `id`, if it exists.
    public func run(id: Int64) throws -> RunRecord? {
        try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE id = ?1", [.integer(id)], operation: "read run \(id)",
            RunRecord.init(row:))
    }

    /// The newest run of `flow` for `subject`, finished or not.
    public func latestRun(flow: String, subject: String) throws -> RunRecord? {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        return try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
            [.text(flow), .text(subject)], operation: "read latest run of \(flow) for \(subject)", RunRecord.init(row:))
    }

    /// The newest run of each (flow, subject), by flow and subject, at most `limit`: optionally
    /// only one flow's or one subject's, and only those whose newest run has `status`.
    public func runs(
        flow: String? = nil, subject: String? = nil, status: RunStatus? = nil, limit: Int = 1000
    ) throws -> [RunRecord] {
        if let flow { try validate(flow, as: "flow name") }
        if let subject { try validate(subject, as: "subject") }
        let bound = LatestRuns.arguments(flow: flow, subject: subject, status: status, limit: limit)
        return try connection.query(
            Self.latestRunsSQL(flow: flow != nil, subject: subject != nil, status: status),
            [.integer(bound.limit)] + bound.texts.map(SQLValue.text), operation: "list runs", RunRecord.init(row:))
    }

    /// ``LatestRuns/sql(flow:subject:status:marker:runColumns:)`` with SQLite's parameters (`?1`, `?2`, …).
    static func latestRunsSQL(flow: Bool, subject: Bool, status: RunStatus?) -> String {
        LatestRuns.sql(flow: flow, subject: subject, status: status, marker: "?", runColumns: RunRecord.columns)
    }

    /// The history entry that entered the step in flight of each of `runIDs` that has one (a
    /// run id to an entry number): what names a parking in
    /// ``unhopParked(flow:subject:step:runID:entry:output:)``.
    public func stepEntries(runIDs: [Int64]) throws -> [Int64: Int64] {
        guard !runIDs.isEmpty else { return [:] }
        // A run's step in flight was entered by the hop entry that holds its token (a seek on
        // the history's primary key, then the run's own entries).
        let rows = try connection.query(
            """
            SELECT h.run_id, h.seq FROM runs r JOIN history h ON h.run_id = r.id AND h.token = r.current_token
            WHERE r.id IN (SELECT value FROM json_each(?1)) AND h.kind = 'hop'
            """, [.text(Self.jsonList(runIDs))], operation: "read the entries of steps in flight"
        ) { ($0.int64(0), $0.int64(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// The names of the flows that have runs here, in order.
    public func flowNames() throws -> [String] {
        try connection.query(Self.flowNamesSQL, [], operation: "list flows") { $0.text(0) }
    }

    /// The names of the flows that have runs, in order (for ``flowNames()``, inside a write, and
    /// PostgreSQL's store: the statement is the same there).
    package static let flowNamesSQL = "\(flowsSQL) SELECT flow FROM flows WHERE flow IS NOT NULL ORDER BY flow"

    /// A common table `flows` of the flow names that have runs (and a last `NULL`), found by one
    /// search of an index by flow per flow: the next name after the last one, until there is
    /// none. (`SELECT DISTINCT flow` read every entry of the index: 50 ms at 1,000,000 runs.)
    static let flowsSQL = """
        WITH RECURSIVE flows(flow) AS (
            SELECT min(flow) FROM runs
            UNION ALL
            SELECT (SELECT min(flow) FROM runs WHERE runs.flow > flows.flow) FROM flows WHERE flows.flow IS NOT NULL
        )
        """

    /// Every run of `flow`, for every subject, oldest first.
    public func allRuns(flow: String) throws -> [RunRecord] {
        try allRuns(flow: flow, after: .min, limit: .max)
    }

    /// The runs of `flow` after run `after`, for every subject, oldest first, at most `limit`
    /// (one search of the index by flow and id).
    public func allRuns(flow: String, after: Int64, limit: Int) throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        return try connection.query(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            [.text(flow), .integer(after), .integer(Int64(max(0, limit)))], operation: "list runs of \(flow)",
            RunRecord.init(row:))
    }

    /// Every run of `flow` for `subject`, oldest first.
    public func allRuns(flow: String, subject: String) throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        return try connection.query(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id",
            [.text(flow), .text(subject)], operation: "list runs of \(flow) for \(subject)", RunRecord.init(row:))
    }

    /// Unfinished runs with `status` whose flow is one of `flows`, oldest first.
    package func unfinishedRuns(status: RunStatus, flows: [String]) throws -> [RunRecord] {
        guard status.isUnfinished else { return [] }
        var runs: [RunRecord] = []
        for flow in flows {
            runs += try connection.query(
                Self.unfinishedRunsSQL(status), [.text(flow)], operation: "list \(status.rawValue) runs of \(flow)",
                RunRecord.init(row:))
        }
        return runs.sorted { $0.id < $1.id }
    }

    /// The runs of flow `?1` with `status` (an unfinished one), oldest first, read through the
    /// index of unfinished runs in its order.
    ///
    /// `INDEXED BY`: without statistics SQLite's planner prefers the index by flow and id, which
    /// gives the order but holds every run of the flow, finished ones too (so it read them all);
    /// with it, a change to the schema that made the index unusable fails to prepare instead of
    /// quietly scanning. The same holds for ``claimableRunsSQL`` and ``runsWithoutPatchSQL``.
    static func unfinishedRunsSQL(_ status: RunStatus) -> String {
        status == .parked ? parkedRunsSQL : runningRunsSQL
    }

    private static let runningRunsSQL =
        "SELECT \(RunRecord.columns) FROM runs INDEXED BY runs_unfinished WHERE \(RunStatus.running.condition) AND flow = ?1 ORDER BY id"
    private static let parkedRunsSQL =
        "SELECT \(RunRecord.columns) FROM runs INDEXED BY runs_unfinished WHERE \(RunStatus.parked.condition) AND flow = ?1 ORDER BY id"

    /// The history of run `runID` in order; with `limit`, its last `limit` entries.
    public func history(runID: Int64, limit: Int? = nil) throws -> [HistoryEntry] {
        if let limit {
            return try connection.query(
                "SELECT * FROM (SELECT \(HistoryEntry.columns) FROM history WHERE run_id = ?1 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
                [.integer(runID), .integer(Int64(limit))], operation: "read history of run \(runID)",
                HistoryEntry.init(row:))
        }
        return try connection.query(
            "SELECT \(HistoryEntry.columns) FROM history WHERE run_id = ?1 ORDER BY seq",
            [.integer(runID)], operation: "read history of run \(runID)", HistoryEntry.init(row:))
    }

    /// The entries of run `runID` after entry `after` and up to entry `through`, in order, at most
    /// `limit` (one search of history's primary key).
    package func history(runID: Int64, after: Int64, through: Int64, limit: Int) throws -> [HistoryEntry] {
        try connection.query(
            "SELECT \(HistoryEntry.columns) FROM history WHERE run_id = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq LIMIT ?4",
            [.integer(runID), .integer(after), .integer(through), .integer(Int64(max(0, limit)))],
            operation: "read history of run \(runID)", HistoryEntry.init(row:))
    }

    /// The sequence number of the last entry of each of `runIDs`, by run; 0 for a run without
    /// entries (a search of history's primary key for each).
    package func historyLengths(runIDs: [Int64]) throws -> [Int64: Int64] {
        guard !runIDs.isEmpty else { return [:] }
        let rows = try connection.query(
            "SELECT r.value, coalesce((SELECT max(h.seq) FROM history h WHERE h.run_id = r.value), 0) FROM json_each(?1) r",
            [.text(Self.jsonList(runIDs))], operation: "read the lengths of \(runIDs.count) histories"
        ) { ($0.int64(0), $0.int64(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// The histories of `runIDs`, each in order, read in one statement (for an engine resuming many runs).
    package func histories(runIDs: [Int64]) throws -> [Int64: [HistoryEntry]] {
        guard !runIDs.isEmpty else { return [:] }
        let list = Self.jsonList(runIDs)
        var histories: [Int64: [HistoryEntry]] = [:]
        histories.reserveCapacity(runIDs.count)
        // Each row goes straight into its run's history: no array of every row first (a run
        // that looped for years holds millions of entries, and that array would double them).
        try connection.forEachRow(
            "SELECT \(HistoryEntry.columns) FROM history WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq",
            [.text(list)], operation: "read the histories of \(runIDs.count) runs"
        ) { row in
            let event = HistoryEntry(row: row)
            histories[event.runID, default: []].append(event)
        }
        return histories
    }

    /// The hops observed in all runs of `flow`: each edge from one entered step to the next, with its count.
    ///
    /// The edges are counted here from the flow's hops in order, not by SQL: a window function
    /// (`lag`) and a `GROUP BY` of text took 8 s at 5,000,000 hops, the ordered scan alone 0.6 s.
    public func hopGraph(flow: String) throws -> [HopEdge] {
        try validate(flow, as: "flow name")
        var graph = HopGraphCount()
        try connection.forEachRow(Self.hopGraphSQL, [.text(flow)], operation: "read hop graph of \(flow)") { row in
            graph.count(run: row.int64(0), step: row.text(1))
        }
        return graph.edges
    }

    /// The hops of the runs of flow `?1`, run by run, each run's in order: the runs from the
    /// index of runs by flow (in order of id) and each one's hops from history's primary key, so
    /// that no sort is needed (the plan test checks it).
    static let hopGraphSQL = """
        SELECT h.run_id, h.step FROM runs r JOIN history h ON h.run_id = r.id
        WHERE r.flow = ?1 AND h.kind = \(HistoryKind.hop.sql)
        ORDER BY r.id, h.seq
        """

    // MARK: Patches

    /// The patches whose new branch runs of `flow` took, by name.
    public func patches(flow: String) throws -> [PatchUsage] {
        try validate(flow, as: "flow name")
        return try connection.query(Self.patchesSQL, [.text(flow)], operation: "list patches of \(flow)") {
            PatchUsage(name: $0.text(0), firstRecordedAt: Clock.date($0.int64(1)), runs: Int($0.int64(2)))
        }
    }

    /// The patches the runs of flow `?1` recorded: the markers read from their partial index,
    /// each with its run. (`CROSS JOIN` keeps that order: without statistics SQLite read every
    /// history entry of every run of the flow instead, 2 s at 1,000,000 runs.)
    static let patchesSQL = """
        SELECT h.step, min(h.at), count(DISTINCT h.run_id) FROM history h CROSS JOIN runs r ON r.id = h.run_id
        WHERE h.kind = \(HistoryKind.patch.sql) AND r.flow = ?1
        GROUP BY h.step ORDER BY h.step
        """

    /// The unfinished runs of `flow` that may still need the old branch of patch `patch`: those
    /// whose history has no marker of it. Some of them may not have reached the patch yet (they will
    /// take its new branch); none outside the list can need the old branch, so the old branch can
    /// be deleted once the list is empty.
    public func runsWithoutPatch(flow: String, patch: String) throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        try validate(patch, as: "patch name")
        return try connection.query(
            Self.runsWithoutPatchSQL, [.text(flow), .text(patch)],
            operation: "list runs without patch \(patch) of \(flow)", RunRecord.init(row:))
    }

    /// The unfinished runs of flow `?1` without a marker of patch `?2` (`INDEXED BY`: see
    /// ``unfinishedRunsSQL(_:)``).
    static let runsWithoutPatchSQL = """
        SELECT \(RunRecord.columns) FROM runs INDEXED BY runs_unfinished
        WHERE flow = ?1 AND status IN \(RunStatus.unfinishedSQL) AND NOT EXISTS (
            SELECT 1 FROM history h WHERE h.run_id = runs.id AND h.kind = \(HistoryKind.patch.sql) AND h.step = ?2)
        ORDER BY id
        """
}
