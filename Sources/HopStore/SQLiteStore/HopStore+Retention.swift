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
        var report = PruneReport(
            runs: 0, historyEntries: 0, batches: 0, reclaimedBytes: 0,
            reclaimsIncrementally: try reclaimsIncrementally(operation: operation))
        // A dry run looks as a prune does, and counts all each look finds.
        let batchSize = dryRun ? Int.max : max(1, pruning.batchSize)
        let span = Int64(max(1, pruning.scanSpan))
        let cutoff = SQLValue.integer(Clock.milliseconds(pruning.finishedBefore))
        var kept = try KeptRuns(keepLast: pruning.keepLast)
        // The runs are looked at in order of id, `span` at a time; no look reads again the runs an
        // earlier one passed over. A look reads without the write lock (a read waits for no one);
        // only the removal of what it found is a transaction, which holds the lock for
        // milliseconds however many runs the database holds or `keepLast` keeps. (One statement
        // over every run held the lock for 0.43 s at 1,000,000 runs even when nothing was old
        // enough; looks that counted each run's newer runs with the lock held, seconds each with
        // a `keepLast` of thousands.)
        let first = try connection.queryOne("SELECT min(id) - 1 FROM runs", [], operation: operation) {
            $0.optionalInt64(0)
        }
        try await Pruning.look(after: first ?? nil, into: &report) { start in
            if start != first ?? nil, !dryRun { try await handOver() }
            // The last id of the next `span` runs: the end of this look (none left: done).
            guard
                let end = try connection.queryOne(
                    "SELECT max(id) FROM (SELECT id FROM runs WHERE id > ?1 ORDER BY id LIMIT ?2)",
                    [.integer(start), .integer(span)], operation: operation, { $0.optionalInt64(0) }
                ) ?? nil
            else { return .done }
            // Never the run with the highest id, so that no id is ever used twice.
            let candidates = try connection.query(
                """
                SELECT id, flow, subject FROM runs
                WHERE id > ?1 AND id <= ?2 AND status NOT IN \(RunStatus.unfinishedSQL) AND updated_at < ?3
                    AND (?4 IS NULL OR flow = ?4) AND id < (SELECT max(id) FROM runs)
                ORDER BY id
                """,
                [.integer(start), .integer(end), cutoff, pruning.flow.map(SQLValue.text) ?? .null],
                operation: operation
            ) { (id: $0.int64(0), flow: $0.text(1), subject: $0.text(2)) }
            var ids: [Int64] = []
            for run in candidates where ids.count < batchSize {
                let lowest = try await kept.lowest(flow: run.flow, subject: run.subject) { flow, subject, offset in
                    try connection.queryOne(
                        "SELECT id FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1 OFFSET ?3",
                        [.text(flow), .text(subject), .integer(offset)], operation: operation
                    ) { $0.int64(0) }
                }
                if run.id < lowest { ids.append(run.id) }
            }
            let found = Pruning.Look(found: ids, batchSize: Int64(batchSize), end: end)
            guard !ids.isEmpty else { return found }
            let list = SQLValue.text(Self.jsonList(ids))
            if dryRun {
                let entries = try connection.queryOne(
                    "SELECT count(*) FROM history WHERE run_id IN (SELECT value FROM json_each(?1))", [list],
                    operation: operation
                ) { Int($0.int64(0)) }
                return found.removed(runs: ids.count, entries: entries ?? 0)
            }
            return try await transaction(operation) { tx in
                // Each run checked again: a fork may have written to it since the look read it.
                let entries = try tx.queryOne(
                    """
                    SELECT count(*) FROM history WHERE run_id IN (
                        SELECT id FROM runs WHERE id IN (SELECT value FROM json_each(?1))
                            AND status NOT IN \(RunStatus.unfinishedSQL) AND updated_at < ?2)
                    """, [list, cutoff], operation: operation
                ) { Int($0.int64(0)) }
                // The history goes with its run (ON DELETE CASCADE).
                let runs = try tx.run(
                    """
                    DELETE FROM runs WHERE id IN (SELECT value FROM json_each(?1))
                        AND status NOT IN \(RunStatus.unfinishedSQL) AND updated_at < ?2
                    """, [list, cutoff], operation: operation)
                return found.removed(runs: runs, entries: entries ?? 0)
            }
        }
        if dryRun {
            report.batches = 0
            return report
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

/// The runs a prune keeps for `keepLast`: of each flow and subject, every run from its
/// `keepLast`-th newest on. Each pair's bound is read once (one search of the index by flow,
/// subject and id, `keepLast` entries long) and remembered for the prune's later looks; counting
/// each run's newer runs instead cost up to `keepLast` steps a run. Both backends' prunes use it.
///
/// A bound read earlier stays right: runs are only added after it (a prune's own removals are
/// below it), which keeps more, never fewer.
package struct KeptRuns {
    let keepLast: Int
    /// The lowest id kept of each pair seen (`Int64.min`: the pair has fewer runs than `keepLast`).
    private var bounds: [Pair: Int64] = [:]
    /// Pairs remembered at most; then forgotten all at once (read again as their runs come).
    static let remembered = 100_000

    private struct Pair: Hashable {
        let flow: String
        let subject: String
    }

    /// Refuses a negative `keepLast`: a mistake, which taken as 0 would remove every old
    /// enough run, each subject's latest too.
    package init(keepLast: Int) throws {
        guard keepLast >= 0 else {
            throw HopError(
                .invalidInput, "keepLast is \(keepLast): a number of runs to keep cannot be negative",
                hint: "Keep 1 (each flow and subject's latest run) or more; 0 keeps none")
        }
        self.keepLast = keepLast
    }

    /// The lowest run id of `flow` for `subject` that the prune keeps: runs below it have
    /// `keepLast` newer runs.
    ///
    /// - Parameter read: the id of the pair's run after skipping `offset` newer ones, if any
    ///   (`ORDER BY id DESC LIMIT 1 OFFSET offset`), read on the caller's actor.
    package mutating func lowest(
        flow: String, subject: String, isolation: isolated (any Actor)? = #isolation,
        read: (_ flow: String, _ subject: String, _ offset: Int64) async throws -> Int64?
    ) async rethrows -> Int64 {
        guard keepLast > 0 else { return .max }
        let pair = Pair(flow: flow, subject: subject)
        if let bound = bounds[pair] { return bound }
        let bound = try await read(flow, subject, Int64(keepLast - 1)) ?? .min
        if bounds.count >= Self.remembered { bounds.removeAll(keepingCapacity: true) }
        bounds[pair] = bound
        return bound
    }
}

/// Which finished runs ``HopStore/prune(_:dryRun:)`` removes.
public struct Pruning: Sendable, Equatable {
    /// Runs that finished (their last change) before this moment.
    public var finishedBefore: Date
    /// Only runs of this flow; every flow when `nil`.
    public var flow: String?
    /// Keep the newest `keepLast` runs of each flow and subject (finished or not), whatever their
    /// age; 0 or more (a prune refuses a negative one, removing nothing).
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

        /// This look, having removed `runs` runs with their `entries` history entries.
        package func removed(runs: Int, entries: Int) -> Look {
            var look = self
            look.runs = runs
            look.entries = entries
            return look
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
