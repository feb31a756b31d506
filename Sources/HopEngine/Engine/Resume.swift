import Foundation

/// Where a run resumes: an engine claims the unfinished runs that no live engine holds, reads
/// their histories and executes them; replay (`Replay`) then brings each body back to where it
/// was. Runs of engines whose process is gone are released first, so they are claimed at once
/// rather than when their leases expire.
extension HopEngine {
    /// Resumes every unfinished, unparked run of the registered flows and versions that no other engine
    /// holds (its lease expired, it has none, or its process is gone); returns how many.
    @discardableResult
    public func resumeAll() async throws -> Int {
        try await environment.releaseRunsOfDeadEngines()
        return try await resumeClaimable()
    }

    /// Claims and executes the runs no live engine holds (`resumeAll` without looking for dead
    /// engines first: the watch has just looked).
    @discardableResult
    func resumeClaimable() async throws -> Int {
        guard !resuming, !stopping else { return 0 }
        environment.holdings.withLock { $0.letGoAfterAFailure = false }  // this look is the one it asked for
        let stopsBefore = stops
        resuming = true
        defer { resuming = false }
        // Only as many as there are free places: the others stay in the database, unclaimed.
        let free = configuration.maxConcurrentRuns - executing.count - waiting.count
        guard free > 0 else {
            claimableLeft = true
            return 0
        }
        let candidates = try await storage.claimableRuns(
            versions: environment.flowVersions, now: storage.now(), limit: free)
        if candidates.count == free { claimableLeft = true }
        var resumed = 0
        // In batches: one transaction claims a batch, one statement reads its histories, and
        // its runs start while the next batch is read.
        for start in stride(from: 0, to: candidates.count, by: Self.resumeBatch) {
            let batch = candidates[start..<min(start + Self.resumeBatch, candidates.count)].map(\.id)
            let leasedAt = ContinuousClock.now
            let claimed = try await storage.claim(runIDs: batch, owner: id, until: environment.leaseEnd)
            let histories: [Int64: [HistoryEntry]]
            do {
                histories = try await storage.histories(runIDs: claimed.map(\.id))
            } catch {
                // Not executed here: the runs go back at once, not when their leases expire.
                await letGo(claimed)
                environment.holdings.withLock { $0.letGoAfterAFailure = true }
                throw error
            }
            if stops != stopsBefore && !stopping {
                // The engine stopped while this batch was claimed: the runs go back at once.
                await letGo(claimed)
                break
            }
            for run in claimed {
                if executing[run.id] == nil {
                    execute(run, claimed: Claim(history: histories[run.id] ?? [], leasedAt: leasedAt))
                } else {
                    executeAgain.insert(run.id)  // an execution that could not claim it is settling
                }
                resumed += 1
            }
        }
        if resumed > 0 { logger.info("resuming unfinished runs", metadata: ["hop.runs": "\(resumed)"]) }
        return resumed
    }

    /// Releases `runs`, claimed by a resume that does not execute them, so that any engine may
    /// claim them at once; from a task of its own, as the resume's may be cancelled (a stop), and
    /// PostgreSQL's client refuses to start a query for a cancelled task. A failed release leaves
    /// them to their leases' expiry.
    private func letGo(_ runs: [RunRecord]) async {
        let (storage, owner, runIDs) = (storage, id, runs.map(\.id))
        do {
            try await Task { try await storage.release(runIDs: runIDs, owner: owner) }.value
        } catch {
            logger.error(
                "cannot release runs this engine claimed but does not execute; they wait for their leases to expire",
                metadata: ["hop.runs": "\(runIDs.count)", "hop.error": "\(error)"])
        }
    }
}

extension ExecutionEnvironment {
    /// Claims `run` for this engine and reads its history; `nil` when another live engine holds
    /// it or it no longer runs.
    func claim(_ run: RunRecord) async throws -> [HistoryEntry]? {
        var leasedAt = ContinuousClock.now
        if try await storage.claim(runID: run.id, owner: owner, until: leaseEnd) == nil {
            // Held elsewhere: by a live engine, or by one whose process is gone (a restart).
            guard try await releaseRunsOfDeadEngines() > 0,
                case let again = ContinuousClock.now,
                try await storage.claim(runID: run.id, owner: owner, until: leaseEnd) != nil
            else {
                logger(for: run).debug("run is held by another engine or no longer runs; not executing it")
                return nil
            }
            leasedAt = again
        }
        hold(run.id, leasedAt: leasedAt)
        return try await storage.history(runID: run.id)
    }

    /// Releases the runs held by engines whose process is gone (their liveness lock is free),
    /// so that they are claimed at once rather than when their leases expire. Returns how many
    /// runs were released.
    @discardableResult
    func releaseRunsOfDeadEngines() async throws -> Int {
        var released = 0
        for (owner, runs) in try await storage.releaseRunsOfDeadIncarnations(except: incarnation) where runs > 0 {
            released += runs
            logger.info(
                "an engine's process is gone; its runs are taken over",
                metadata: [
                    "hop.engine": "\(Incarnation.label(of: owner))", "hop.incarnation": "\(owner)",
                    "hop.runs": "\(runs)",
                ])
        }
        return released
    }
}
