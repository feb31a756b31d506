/// Group commit: the writes that arrive while a commit is in progress share the next
/// transaction, so that many concurrent runs need one fsync rather than one each.
///
/// Each write still runs in its own savepoint (one that throws rolls back alone and
/// changes nothing), and each caller resumes only once the transaction holding its write
/// has committed: nothing is acknowledged before it is durable.
extension HopStore {
    struct PendingWrite {
        let operation: String
        /// Runs the write inside the shared transaction, on the store's connection, and keeps its result.
        let apply: (Connection) throws -> Void
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

    /// Commits every pending write in one transaction (`Connection.write`, as migrations do).
    private func flush() {
        flushScheduled = false
        let batch = pending
        pending.removeAll(keepingCapacity: true)
        guard !batch.isEmpty else { return }
        let operation =
            batch.count == 1 ? batch[0].operation : "\(batch[0].operation) and \(batch.count - 1) more writes"
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
                failures = try connection.write(operation) { applyEachInSavepoint(batch) }
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

    /// Applies each write of `batch` in a savepoint of its own; returns each one's error.
    private func applyEachInSavepoint(_ batch: [PendingWrite]) -> [(any Error)?] {
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
