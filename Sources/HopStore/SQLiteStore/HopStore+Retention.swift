#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Retention: deleting finished runs and their history, in short transactions beside daemons.
extension HopStore {
    /// Removes the runs `pruning` selects with their history, a batch per transaction, so that a
    /// daemon beside it waits at most one batch for the write lock; then gives the freed pages
    /// back to the file system, a few at a time, when the database is in incremental auto-vacuum
    /// mode (every database Hop creates is). Unfinished runs, first-use flags and sessions are
    /// never removed, nor the run with the highest id (so that no id is ever used twice).
    ///
    /// - Parameter dryRun: count what would be removed and change nothing.
    /// - Returns: what was removed (or would be, with `dryRun`).
    public func prune(_ pruning: Pruning, dryRun: Bool = false) async throws -> PruneReport {
        if let flow = pruning.flow { try validate(flow, as: "flow name") }
        let operation = "prune runs finished before \(pruning.finishedBefore.formatted(.iso8601))"
        // `+r.id` keeps "never the highest id" out of the search's bounds: a look's own bounds
        // (below) must bound it, or each look reads on to the last run.
        let selection = """
            FROM runs r
            WHERE r.status NOT IN \(RunStatus.unfinishedSQL) AND r.updated_at < ?1 AND (?2 IS NULL OR r.flow = ?2)
                AND +r.id < (SELECT max(id) FROM runs)
                AND (SELECT count(*) FROM (
                    SELECT 1 FROM runs n WHERE n.flow = r.flow AND n.subject = r.subject AND n.id > r.id LIMIT ?3
                )) >= ?3
            """
        let arguments: [SQLValue] = [
            .integer(Clock.milliseconds(pruning.finishedBefore)), pruning.flow.map(SQLValue.text) ?? .null,
            .integer(Int64(max(0, pruning.keepLast))),
        ]
        if dryRun {
            let counts = try connection.queryOne(
                "SELECT count(*), coalesce(sum((SELECT count(*) FROM history h WHERE h.run_id = r.id)), 0) \(selection)",
                arguments, operation: operation
            ) { (Int($0.int64(0)), Int($0.int64(1))) }
            return PruneReport(
                runs: counts?.0 ?? 0, historyEntries: counts?.1 ?? 0, batches: 0, reclaimedBytes: 0,
                reclaimsIncrementally: try reclaimsIncrementally(operation: operation))
        }
        var report = PruneReport(
            runs: 0, historyEntries: 0, batches: 0, reclaimedBytes: 0,
            reclaimsIncrementally: try reclaimsIncrementally(operation: operation))
        let batchSize = Int64(max(1, pruning.batchSize))
        let span = Int64(max(1, pruning.scanSpan))
        // The runs are looked at in order of id, `span` at a time, each look (and the batch it
        // removes) a transaction of its own that holds the write lock for milliseconds, however
        // many runs the database holds; no look reads again the runs an earlier one passed over.
        // (One statement over every run held the lock for 0.43 s at 1,000,000 runs even when
        // nothing was old enough.)
        let first = try connection.queryOne("SELECT min(id) - 1 FROM runs", [], operation: operation) {
            $0.optionalInt64(0)
        }
        try await Pruning.look(after: first ?? nil, into: &report) { start in
            if start != first ?? nil { try await handOver() }
            return try await transaction(operation) { tx in
                // The last id of the next `span` runs: the end of this look (none left: done).
                guard
                    let end = try tx.queryOne(
                        "SELECT max(id) FROM (SELECT id FROM runs WHERE id > ?1 ORDER BY id LIMIT ?2)",
                        [.integer(start), .integer(span)], operation: operation, { $0.optionalInt64(0) }
                    ) ?? nil
                else { return .done }
                let ids = try tx.query(
                    "SELECT r.id \(selection) AND r.id > ?5 AND r.id <= ?6 ORDER BY r.id LIMIT ?4",
                    arguments + [.integer(batchSize), .integer(start), .integer(end)], operation: operation
                ) { $0.int64(0) }
                guard !ids.isEmpty else { return Pruning.Look(found: ids, batchSize: batchSize, end: end) }
                let list = SQLValue.text(Self.jsonList(ids))
                let entries = try tx.queryOne(
                    "SELECT count(*) FROM history WHERE run_id IN (SELECT value FROM json_each(?1))", [list],
                    operation: operation
                ) { Int($0.int64(0)) }
                // The history goes with its run (ON DELETE CASCADE).
                let runs = try tx.run(
                    "DELETE FROM runs WHERE id IN (SELECT value FROM json_each(?1))", [list], operation: operation)
                return Pruning.Look(found: ids, batchSize: batchSize, end: end, runs: runs, entries: entries ?? 0)
            }
        }
        if report.runs > 0 { report.reclaimedBytes = try await reclaimFreePages(operation: operation) }
        return report
    }

    /// Gives free pages back to the file system in short transactions when the database is in
    /// incremental auto-vacuum mode; returns how many bytes that freed (0 in any other mode: the
    /// free pages are reused by later writes, and ``vacuum()`` gives them back).
    @discardableResult
    public func reclaimFreePages(operation: String = "reclaim free pages") async throws -> Int64 {
        guard try reclaimsIncrementally(operation: operation) else { return 0 }
        let pageSize = try connection.queryOne("PRAGMA page_size", [], operation: operation) { $0.int64(0) } ?? 4096
        var freed: Int64 = 0
        while true {
            try Task.checkCancellation()
            if freed > 0 { try await handOver() }
            let pages: Int64 = try await transaction(operation) { tx in
                let before = try tx.queryOne("PRAGMA freelist_count", [], operation: operation) { $0.int64(0) } ?? 0
                guard before > 0 else { return 0 }
                // About 0.09 ms a page moved, with the write lock held: 500 pages hold it about
                // 45 ms, as long as a batch of a prune (2,000 held it 190 ms).
                try tx.run("PRAGMA incremental_vacuum(500)", [], operation: operation)
                let after = try tx.queryOne("PRAGMA freelist_count", [], operation: operation) { $0.int64(0) } ?? 0
                return before - after
            }
            guard pages > 0 else { break }
            freed += pages * pageSize
        }
        // The file shrinks when the log is copied back into it.
        try makeDurable()
        try connection.execute("PRAGMA wal_checkpoint(PASSIVE)", operation: operation)
        return freed
    }

    /// How long a prune or a reclaim leaves the write lock free between two of its transactions.
    ///
    /// SQLite's lock keeps no queue: another process gets it only by trying while it is free. A
    /// Hop connection waiting for it tries every millisecond (`BusyWait`), so a pause of 2 ms
    /// lets a daemon's waiting write in between any two transactions of a prune, instead of
    /// after seconds (2.8 s beside a prune of 1,000,000 runs with back-to-back transactions).
    static let handOver: Duration = .milliseconds(2)

    /// Leaves the write lock free for `handOver` (no transaction is open here). The store's
    /// thread goes on with other work meanwhile: this task sleeps, the thread does not.
    private func handOver() async throws {
        try await Task.sleep(for: Self.handOver)
    }

    /// Whether the database is in incremental auto-vacuum mode (`PRAGMA auto_vacuum` 2).
    func reclaimsIncrementally(operation: String) throws -> Bool {
        try connection.queryOne("PRAGMA auto_vacuum", [], operation: operation) { $0.int64(0) } == 2
    }

    /// Rewrites the whole database (`VACUUM`) in incremental auto-vacuum mode, so that its free
    /// pages go back to the file system now and later prunes give theirs back as they go. For a
    /// database created before Hop set that mode. Holds the write lock while it runs (daemons
    /// wait, up to their busy timeout, then report busy): run it when they are stopped or idle.
    /// Returns how many bytes the file shrank by.
    @discardableResult
    public func vacuum() throws -> Int64 {
        let operation = "vacuum the database"
        try makeDurable()
        let before = try fileBytes(operation: operation)
        try connection.execute("PRAGMA auto_vacuum = INCREMENTAL", operation: operation)
        try connection.execute("VACUUM", operation: operation)
        try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)", operation: operation)
        return max(0, before - (try fileBytes(operation: operation)))
    }

    /// The size of the database's pages in use and free, in bytes (the main file once checkpointed).
    public func fileBytes(operation: String = "read the database's size") throws -> Int64 {
        let pages = try connection.queryOne("PRAGMA page_count", [], operation: operation) { $0.int64(0) } ?? 0
        let pageSize = try connection.queryOne("PRAGMA page_size", [], operation: operation) { $0.int64(0) } ?? 4096
        return pages * pageSize
    }
}

/// Which finished runs ``HopStore/prune(_:dryRun:)`` removes.
public struct Pruning: Sendable, Equatable {
    /// Runs that finished (their last change) before this moment.
    public var finishedBefore: Date
    /// Only runs of this flow; every flow when `nil`.
    public var flow: String?
    /// Keep the newest `keepLast` runs of each flow and subject (finished or not), whatever their age.
    public var keepLast: Int
    /// Runs removed per transaction at most.
    public var batchSize: Int
    /// Runs looked at per transaction, in order of id: the prune reads the database this much
    /// at a time, so that no transaction of it scans every run.
    public var scanSpan: Int

    public init(
        finishedBefore: Date, flow: String? = nil, keepLast: Int = 1, batchSize: Int = 500, scanSpan: Int = 10_000
    ) {
        self.finishedBefore = finishedBefore
        self.flow = flow
        self.keepLast = keepLast
        self.batchSize = batchSize
        self.scanSpan = scanSpan
    }
}

extension Pruning {
    /// What one look of a prune removed, and where the next look starts.
    package struct Look: Sendable {
        /// Runs removed, and their history entries.
        package var runs = 0
        package var entries = 0
        /// The id after which the next look starts; `nil` when no run is left to look at.
        package var next: Int64?

        /// A look over the runs after one id up to `end` that found `ids` to remove, at most
        /// `batchSize` of them: a full batch may leave more in the look, so the next one goes
        /// on after the last removed; otherwise after the look's end.
        package init(found ids: [Int64], batchSize: Int64, end: Int64, runs: Int = 0, entries: Int = 0) {
            self.runs = runs
            self.entries = entries
            next = Int64(ids.count) == batchSize ? ids.last : end
        }

        /// No run is left to look at.
        package static let done = Look()

        private init() {}
    }

    /// Runs `look` over the database's runs, from the one after `first` on, each look starting
    /// where the one before ended, until a look finds no run left; adds what they removed to
    /// `report` (a batch for each look that removed runs). Stops at cancellation. Runs on the
    /// caller's actor (the store's), where the looks' transactions do.
    package static func look(
        after first: Int64?, into report: inout PruneReport, isolation: isolated (any Actor)? = #isolation,
        _ look: (_ after: Int64) async throws -> Look
    ) async throws {
        var after = first
        while let start = after {
            try Task.checkCancellation()
            let result = try await look(start)
            if result.runs > 0 {
                report.runs += result.runs
                report.historyEntries += result.entries
                report.batches += 1
            }
            after = result.next
        }
    }
}

/// What a prune removed.
public struct PruneReport: Sendable, Equatable {
    /// Runs removed (or that would be, in a dry run).
    public var runs: Int
    /// History entries removed with them.
    public var historyEntries: Int
    /// Transactions that removed runs.
    public var batches: Int
    /// Bytes given back to the file system (0 unless the database is in incremental auto-vacuum mode).
    public var reclaimedBytes: Int64
    /// Whether the database gives freed pages back as it goes (every database Hop created since
    /// 0.2.0); otherwise they are reused by later writes, and ``HopStore/vacuum()`` gives them back.
    public var reclaimsIncrementally: Bool

    public init(runs: Int, historyEntries: Int, batches: Int, reclaimedBytes: Int64, reclaimsIncrementally: Bool) {
        self.runs = runs
        self.historyEntries = historyEntries
        self.batches = batches
        self.reclaimedBytes = reclaimedBytes
        self.reclaimsIncrementally = reclaimsIncrementally
    }
}
