import Logging
import Synchronization

extension ExecutionEnvironment {
    /// How long a stop waits for each of its calls to the database (the release of the runs it
    /// lets go, the read of a stopped run for the observer). They take milliseconds; a database
    /// that does not answer (a PostgreSQL server away: its client holds a query until it gives
    /// up connecting, a minute later) must not hold the stop past a service manager's stop
    /// timeout (10 s in the example unit).
    static let longestStopWait = Duration.seconds(2)

    /// Releases `runIDs`, which this engine lets go as it stops, so that another engine takes
    /// them at once. From a task of its own: the stopping one may be cancelled (a service
    /// group's shutdown), and PostgreSQL's client refuses to start a query for a cancelled task.
    /// Waited for at most ``longestStopWait``; a release that takes longer goes on meanwhile,
    /// and the runs are taken over anyway once this process is gone (its liveness lock goes with
    /// it) or their leases expire. `what` names the runs in the log (a failed or late release).
    /// Returns the release's task: a read of the runs that must see them released waits for it.
    @discardableResult
    func releaseAsStopping(_ runIDs: [Int64], what: Logger.Message) async -> Task<Void, Never> {
        let (storage, owner, logger) = (storage, owner, logger)
        let release = Task {
            do {
                try await storage.release(runIDs: runIDs, owner: owner)
            } catch {
                logger.error(
                    "cannot release \(what) as the engine stopped; another engine takes them when their lease expires or this process is gone",
                    metadata: ["hop.runs": "\(runIDs.count)", "hop.error": "\(error)"])
            }
        }
        if await waitAtMost(Self.longestStopWait, for: { await release.value }) == nil {
            logger.warning(
                "stopped without waiting longer for the release of \(what): the database does not answer; another engine takes them when their lease expires or this process is gone",
                metadata: ["hop.runs": "\(runIDs.count)", "hop.waited": "\(Self.longestStopWait)"])
        }
        return release
    }
}

/// Runs `work` in a task of its own and waits for it, at most `limit`, even if the caller is
/// cancelled: returns what it returned, or `nil` when it did not finish in time (it then goes on
/// without a waiter).
func waitAtMost<Value: Sendable>(
    _ limit: Duration, for work: @escaping @Sendable () async -> Value
) async -> Value? {
    let waiter = Waiter<Value>()
    return await withCheckedContinuation { continuation in
        waiter.wait(with: continuation)
        let timer = Task {
            try? await Task.sleep(for: limit)
            waiter.finish(nil)
        }
        Task {
            waiter.finish(await work())
            timer.cancel()
        }
    }
}

/// The one waiter of ``waitAtMost(_:for:)``, resumed by whichever comes first.
private final class Waiter<Value: Sendable>: Sendable {
    private let continuation = Mutex<CheckedContinuation<Value?, Never>?>(nil)

    func wait(with continuation: CheckedContinuation<Value?, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    /// Resumes the waiter with `value` unless it was resumed already.
    func finish(_ value: Value?) {
        continuation.withLock { $0.take() }?.resume(returning: value)
    }
}
