/// Group commit and coalesced writes: many writes share one transaction, so that many runs —
/// and the several records of one run between two of its hops — need one fsync.
///
/// - A write for `.now` (``WriteDurability``) waits in `pending`; the writes that arrive while
///   a commit is in progress share the next transaction, and each caller resumes once the
///   transaction holding its write has committed.
/// - A `.coalesced` write is applied at once inside the store's open write transaction (begun
///   by the first such write) and its caller resumes without waiting for a commit. The next
///   `.now` commit commits it too; otherwise it commits ``HopStore/Options/commitDelay`` later.
///
/// A write that throws changes nothing. A write refuses (a fence, a stale token, a finished
/// run) before it changes anything, so in a shared transaction it needs no savepoint: it is
/// undone alone only where it changed something before it failed (a full disk, an I/O error),
/// and there the open transaction is lost with it. What is durable is always a prefix of what
/// was applied: a crash or a failed commit loses the open transaction's writes together, never
/// one without those applied after it.
extension HopStore {
    struct PendingWrite {
        let operation: String
        /// Runs the write inside the shared transaction, on the store's connection, and keeps its result.
        let apply: (Connection) throws -> Void
        /// Resumes the caller: with the kept result, or with the error that undid the write.
        let finish: ((any Error)?) -> Void
    }

    /// The write transaction that holds coalesced writes until it commits.
    struct OpenTransaction {
        let number: Int
        /// The runs with a coalesced write in it.
        var runs: Set<Int64> = []
        var writes = 0
        /// The callers waiting for its commit (``waitUntilDurable()``).
        var waiters: [CheckedContinuation<Void, any Error>] = []
    }

    /// How many write transactions this store committed, and how many writes they held.
    public struct CommitStatistics: Sendable, Equatable {
        public var transactions = 0
        public var writes = 0
    }

    /// The transactions committed so far, and the writes they held.
    public var commitStatistics: CommitStatistics { statistics }

    /// Runs `body` as one write, durable (`.now`) or coalesced, and returns its result: once
    /// committed, or once applied.
    ///
    /// - Parameter runID: the run the write records for, if any: a run whose coalesced writes
    ///   were lost to a failed commit is refused until it is claimed again.
    func write<T: Sendable>(
        _ durability: WriteDurability, _ operation: String, runID: Int64? = nil,
        _ body: @escaping (WriteTransaction) throws -> T
    ) async throws -> T {
        if let runID, !lostRuns.isEmpty, lostRuns.contains(runID) { throw lostRecords(runID, operation: operation) }
        switch durability {
        case .now: return try await transaction(operation, body)
        case .coalesced: return try coalesced(operation, runID: runID, body)
        }
    }

    /// Runs `body` as one write of the next group transaction and returns its result once committed.
    @discardableResult
    func transaction<T: Sendable>(
        _ operation: String, _ body: @escaping (WriteTransaction) throws -> T
    ) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            var result: Result<T, any Error> = .failure(
                HopError(.sqlite, operation: operation, path: path, reason: "the write was not applied"))
            pending.append(
                PendingWrite(
                    operation: operation,
                    apply: { connection in
                        do {
                            result = .success(try body(WriteTransaction(connection: connection, operation: operation)))
                        } catch {
                            result = .failure(error)
                            throw error
                        }
                    },
                    finish: { error in
                        if let error { continuation.resume(throwing: error) } else { continuation.resume(with: result) }
                    }))
            if !flushScheduled {
                flushScheduled = true
                Task { self.flush() }
            }
        }
    }

    /// Applies `body` in the open write transaction (beginning one).
    private func coalesced<T>(_ operation: String, runID: Int64?, _ body: (WriteTransaction) throws -> T) throws -> T {
        if open == nil {
            try connection.run("BEGIN IMMEDIATE", [], operation: operation)
            transactionsOpened += 1
            let number = transactionsOpened
            open = OpenTransaction(number: number)
            executor.setTimer(after: commitDelay) { [weak self] in await self?.commitDue(number) }
        }
        let changes = connection.totalChanges
        do {
            let result = try body(WriteTransaction(connection: connection, operation: operation))
            open?.writes += 1
            if let runID { open?.runs.insert(runID) }
            return result
        } catch {
            if !connection.changedNothing(since: changes) { loseOpen(after: error) }
            throw error
        }
    }

    /// Commits open transaction `number` if it is still open: its commit delay has passed.
    private func commitDue(_ number: Int) {
        if open?.number == number { commitOpen(operation: "commit coalesced writes") }
    }

    /// Commits the open transaction now, if one is open: every write applied so far is durable
    /// when this returns.
    package func makeDurable() throws {
        if let error = commitOpen(operation: "commit coalesced writes") { throw error }
    }

    /// Waits until every write applied so far is durable: committed with the next durable
    /// write, or ``Options/commitDelay`` after the first coalesced one at the latest.
    /// - Throws: when the writes of run `runID` were lost to a failed commit, before or while it waits.
    package func waitUntilDurable(runID: Int64) async throws {
        let operation = "wait for run \(runID) to be durable"
        if lostRuns.contains(runID) { throw lostRecords(runID, operation: operation) }
        guard let number = open?.number else { return }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            // Not necessarily at once: for a caller whose task prefers an executor of its own (a
            // server's event loop, say), the runtime queues this closure behind the store's other
            // work, which may have ended that transaction meanwhile.
            if open?.number == number {
                open?.waiters.append(continuation)
            } else if lostRuns.contains(runID) {
                continuation.resume(throwing: lostRecords(runID, operation: operation))
            } else {
                continuation.resume()
            }
        }
    }

    /// Counts run `runID` among the runs with a write in the open transaction, if one is open:
    /// a failed commit then loses its writes (a run created there, say) like theirs.
    func holdsWrites(of runID: Int64) {
        open?.runs.insert(runID)
    }

    /// Commits every pending write in one transaction: the open one, or one of its own
    /// (`Connection.write`, as migrations do).
    private func flush() {
        flushScheduled = false
        let batch = pending
        pending.removeAll(keepingCapacity: true)
        guard !batch.isEmpty else { return }
        let operation =
            batch.count == 1 ? batch[0].operation : "\(batch[0].operation) and \(batch.count - 1) more writes"
        if open != nil {
            flushIntoOpen(batch, operation: operation)
            return
        }
        var aWriteFailed = false
        let failures: [(any Error)?]
        do {
            // The common case: no write fails, and none needs a savepoint.
            try connection.write(operation) {
                for write in batch {
                    do {
                        try write.apply(connection)
                    } catch {
                        aWriteFailed = true
                        throw error
                    }
                }
            }
            failures = Array(repeating: nil, count: batch.count)
        } catch  where aWriteFailed && batch.count > 1 {
            // One write failed and the transaction was rolled back: start over with each write in
            // a savepoint of its own, so that it alone is undone.
            do {
                failures = try connection.write(operation) { try applyEachInSavepoint(batch) }
            } catch {
                for write in batch { write.finish(error) }
                return
            }
        } catch {
            // The transaction could not begin or commit, or the one write in it failed.
            for write in batch { write.finish(error) }
            return
        }
        statistics.transactions += 1
        statistics.writes += failures.count { $0 == nil }
        for (write, failure) in zip(batch, failures) { write.finish(failure) }
    }

    /// Applies `batch` in the open transaction and commits them all.
    private func flushIntoOpen(_ batch: [PendingWrite], operation: String) {
        let failures: [(any Error)?]
        do {
            failures = try applyEachRefusingAlone(batch)
        } catch {
            loseOpen(after: error)
            for write in batch { write.finish(error) }
            return
        }
        open?.writes += failures.count { $0 == nil }
        if let error = commitOpen(operation: operation) {
            for write in batch { write.finish(error) }
        } else {
            for (write, failure) in zip(batch, failures) { write.finish(failure) }
        }
    }

    /// Commits the open transaction, if any; returns the error that lost it, if it was lost.
    @discardableResult
    private func commitOpen(operation: String) -> (any Error)? {
        guard let transaction = open else { return nil }
        do {
            guard connection.isInTransaction else {
                throw HopError(
                    .ioFailure, operation: operation, path: path,
                    reason: "SQLite rolled the transaction back after an earlier error")
            }
            try connection.commit(operation)
        } catch {
            loseOpen(after: error)
            return error
        }
        open = nil
        statistics.transactions += 1
        statistics.writes += transaction.writes
        for waiter in transaction.waiters { waiter.resume() }
        return nil
    }

    /// The open transaction could not commit, or SQLite rolled it back: rolls back what is left
    /// of it, and its coalesced writes are lost. Their runs are released (best effort), so that
    /// they are claimed again and resume from their durable history, and until then refused.
    private func loseOpen(after error: any Error) {
        connection.rollback()
        guard let transaction = open else { return }
        open = nil
        for waiter in transaction.waiters { waiter.resume(throwing: error) }
        guard !transaction.runs.isEmpty else { return }
        lostRuns.formUnion(transaction.runs)
        if let highest = transaction.runs.max() { connection.runIDFloor = max(connection.runIDFloor, highest + 1) }
        logger.error(
            "a commit failed: the latest records of \(transaction.runs.count) runs were lost; they resume from their durable history",
            metadata: ["hop.error": "\(error)"])
        let ids = Self.jsonList(Array(transaction.runs))
        _ = try? connection.write("release runs whose records were lost") {
            try connection.run(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE id IN (SELECT value FROM json_each(?1))",
                [.text(ids)], operation: "release runs whose records were lost")
        }
    }

    private func lostRecords(_ runID: Int64, operation: String) -> HopError {
        HopError(
            .ioFailure, operation: operation, path: path,
            reason: "records of run \(runID) were lost when a commit failed; it resumes from its durable history",
            hint: "Check the disk; the run is executed again once it is claimed")
    }

    /// Forgets that runs' writes were lost: they were claimed again and their history read afresh.
    func forgetLostRuns(_ runIDs: some Sequence<Int64>) {
        guard !lostRuns.isEmpty else { return }
        lostRuns.subtract(runIDs)
    }

    /// Applies each write of `batch` in the current transaction, without savepoints; returns
    /// each one's error. A write that refused changed nothing and fails alone. Throws when a
    /// write failed after it changed something, or SQLite rolled the transaction back: then no
    /// write of the batch, nor any before it in the transaction, holds.
    private func applyEachRefusingAlone(_ batch: [PendingWrite]) throws -> [(any Error)?] {
        var failures: [(any Error)?] = []
        failures.reserveCapacity(batch.count)
        for write in batch {
            let changes = connection.totalChanges
            do {
                try write.apply(connection)
                failures.append(nil)
            } catch {
                guard connection.changedNothing(since: changes) else { throw error }
                failures.append(error)
            }
        }
        return failures
    }

    /// Applies each write of `batch` in a savepoint of its own; returns each one's error.
    /// Throws when the transaction itself was lost (SQLite rolls it back after a full disk or
    /// an I/O error): then no write of the batch, nor any before it in the transaction, holds.
    private func applyEachInSavepoint(_ batch: [PendingWrite]) throws -> [(any Error)?] {
        var failures: [(any Error)?] = []
        failures.reserveCapacity(batch.count)
        for write in batch {
            do {
                try connection.run("SAVEPOINT hop_write", [], operation: write.operation)
                do {
                    try write.apply(connection)
                    try connection.run("RELEASE hop_write", [], operation: write.operation)
                    failures.append(nil)
                } catch {
                    guard connection.isInTransaction else { throw error }
                    try connection.run("ROLLBACK TO hop_write", [], operation: write.operation)
                    try connection.run("RELEASE hop_write", [], operation: write.operation)
                    failures.append(error)
                }
            } catch {
                guard connection.isInTransaction else { throw error }
                failures.append(error)
            }
        }
        return failures
    }
}
