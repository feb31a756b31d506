/// Group commit: the writes that arrive while a commit is in progress share the next
/// transaction, so that many concurrent runs need one fsync rather than one each.
///
/// Each write still runs in its own savepoint (one that throws rolls back alone and
/// changes nothing), and each caller resumes only once the transaction holding its write
/// has committed: nothing is acknowledged before it is durable.
extension HopStore {
    struct PendingWrite {
        let operation: String
        /// Runs the write inside the shared transaction and keeps its result.
        let apply: () throws -> Void
        /// Resumes the caller: with the kept result, or with the error that undid the write.
        let finish: ((any Error)?) -> Void
    }

    /// How many write transactions this store committed, and how many writes they held.
    public struct CommitStatistics: Sendable, Equatable {
        public var transactions = 0
        public var writes = 0
    }

    /// The transactions committed so far, and the writes they held.
    public var commitStatistics: CommitStatistics { statistics }

    /// Runs `body` as one write of the next group transaction and returns its result once committed.
    @discardableResult
    func transaction<T: Sendable>(_ operation: String, _ body: @escaping () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            var result: Result<T, any Error> = .failure(
                HopError(.sqlite, operation: operation, path: path, reason: "the write was not applied"))
            pending.append(
                PendingWrite(
                    operation: operation,
                    apply: {
                        do {
                            result = .success(try body())
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

    /// Commits every pending write in one transaction.
    private func flush() {
        flushScheduled = false
        let batch = pending
        pending.removeAll(keepingCapacity: true)
        guard !batch.isEmpty else { return }
        let operation =
            batch.count == 1 ? batch[0].operation : "\(batch[0].operation) and \(batch.count - 1) more writes"
        do {
            try connection.run("BEGIN IMMEDIATE", [], operation: operation)
        } catch {
            for write in batch { write.finish(error) }
            return
        }
        var failures: [(any Error)?]
        if let applied = applyAll(batch) {
            failures = applied
        } else if batch.count == 1 {
            // Alone in its transaction, it failed: the rollback undoes it.
            return
        } else {
            // One write failed: start over with each write in a savepoint of its own, so that
            // it alone is undone.
            do {
                try connection.run("BEGIN IMMEDIATE", [], operation: operation)
            } catch {
                for write in batch { write.finish(error) }
                return
            }
            failures = applyEachInSavepoint(batch)
        }
        do {
            try connection.run("COMMIT", [], operation: operation)
            statistics.transactions += 1
            statistics.writes += failures.count { $0 == nil }
            for (write, failure) in zip(batch, failures) { write.finish(failure) }
        } catch {
            connection.rollback()
            for write in batch { write.finish(error) }
        }
    }

    /// Applies every write of `batch` in the open transaction, without savepoints: the common
    /// case, where none fails. When one fails, rolls the transaction back and returns `nil`
    /// (a batch of one is finished with its error).
    private func applyAll(_ batch: [PendingWrite]) -> [(any Error)?]? {
        for write in batch {
            do {
                try write.apply()
            } catch {
                connection.rollback()
                if batch.count == 1 { write.finish(error) }
                return nil
            }
        }
        return Array(repeating: nil, count: batch.count)
    }

    /// Applies each write of `batch` in a savepoint of its own; returns each one's error.
    private func applyEachInSavepoint(_ batch: [PendingWrite]) -> [(any Error)?] {
        var failures: [(any Error)?] = []
        failures.reserveCapacity(batch.count)
        for write in batch {
            do {
                try connection.run("SAVEPOINT hop_write", [], operation: write.operation)
                do {
                    try write.apply()
                    try connection.run("RELEASE hop_write", [], operation: write.operation)
                    failures.append(nil)
                } catch {
                    try connection.run("ROLLBACK TO hop_write", [], operation: write.operation)
                    try connection.run("RELEASE hop_write", [], operation: write.operation)
                    failures.append(error)
                }
            } catch {
                failures.append(error)
            }
        }
        return failures
    }
}
