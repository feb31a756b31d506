import PostgresNIO
import Synchronization

/// The connection a statement went out on closed, and the statement was never answered.
package struct ConnectionClosed: Error {
    /// Whether the transaction's `COMMIT` (or its rollback) was under way: whether the change
    /// took is unknown. Otherwise the server did nothing of it (it rolls back a transaction
    /// whose connection ends), and it may be run again.
    package var whileCommitting = false
}

/// Work on PostgreSQL connections that ends when its connection closes.
///
/// PostgresNIO 1.33 loses a statement written to a connection that has just closed: the
/// statement's promise is never completed, and whoever awaits it waits forever, cancelled or not
/// (vapor/postgres-nio#487 fixed it, #501 reverted the fix). That happens whenever the server
/// ends a connection as it is handed out (a restart or stop of the server, an operator's
/// `pg_terminate_backend`), and it left an engine's watch, a lease renewal, a stop or the
/// liveness lock waiting for good.
///
/// So the work runs in a task of its own, and its caller waits for whichever comes first: the
/// work's end, or the connection's close and then ``grace`` more (time for the answer or error
/// of a statement that went out before the close to arrive). In the second case the caller
/// gets ``ConnectionClosed`` and the work is left waiting on its lost statement. The caller's
/// cancellation reaches the work.
///
/// A connection is watched with one callback on its close, however many statements run on it.
package enum ClosedConnections {
    /// How long after a connection closed its work may still end on its own.
    package static let grace = Duration.seconds(1)

    /// The connections work runs on, by identity, with what each waiting caller is told when the
    /// connection closes; a connection leaves once it closed.
    private static let watched = Mutex<(connections: [ObjectIdentifier: [Int: @Sendable () -> Void]], next: Int)>(
        ([:], 0))

    /// `body` on `connection`; throws `closedError()` (``ConnectionClosed`` unless said otherwise)
    /// when the connection closes and `body` has not ended ``grace`` later.
    package static func run<T: Sendable>(
        on connection: PostgresConnection,
        closedError: @escaping @Sendable () -> any Error = { ConnectionClosed() },
        _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let outcome = Outcome<T>()
        let key = ObjectIdentifier(connection)
        let (number, firstSeen) = watched.withLock { watched -> (Int, Bool) in
            let number = watched.next
            watched.next &+= 1
            let firstSeen = watched.connections[key] == nil
            watched.connections[key, default: [:]][number] = { outcome.finish(.failure(closedError())) }
            return (number, firstSeen)
        }
        defer { watched.withLock { _ = $0.connections[key]?.removeValue(forKey: number) } }
        if firstSeen {
            // Already closed: the callback comes at once, on the connection's event loop.
            connection.closeFuture.whenComplete { _ in
                let waiting = watched.withLock { $0.connections.removeValue(forKey: key) } ?? [:]
                guard !waiting.isEmpty else { return }
                // Timed on the cooperative pool, as the work is: on a loaded machine, whose pool
                // is slow to run what waits, the work that was answered before the close (its
                // promise completed as the connection closed) resumes first and ends with its
                // own answer. A timer on the event loop fired regardless (CI's first minute).
                Task {
                    try? await Task.sleep(for: grace)
                    for tell in waiting.values { tell() }
                }
            }
        }
        let work = Task {
            do {
                outcome.finish(.success(try await body(connection)))
            } catch {
                outcome.finish(.failure(error))
            }
        }
        return try await withTaskCancellationHandler {
            try await outcome.value()
        } onCancel: {
            work.cancel()
        }
    }
}

extension PostgresConnection {
    /// The rows of `query` on this connection, each decoded by `decode` as it arrives: the
    /// client's rows are never all held beside what they decode to.
    func decodedRows<T>(of query: PostgresQuery, _ decode: (Row) throws -> T) async throws -> [T] {
        var decoded: [T] = []
        for try await row in try await self.query(query, logger: PostgresStore.quiet) {
            decoded.append(try decode(Row(row)))
        }
        return decoded
    }

    /// The rows of `query`, run on this connection, watched for its close.
    func rows(of query: PostgresQuery) async throws -> [PostgresRow] {
        try await ClosedConnections.run(on: self) { connection in
            try await connection.query(query, logger: PostgresStore.quiet).collect()
        }
    }
}

extension PostgresClient {
    /// The rows of `query`, run on a connection of the pool that is watched for its close.
    func rows(of query: PostgresQuery) async throws -> [PostgresRow] {
        try await withWatchedConnection { connection in
            try await connection.query(query, logger: PostgresStore.quiet).collect()
        }
    }

    /// The rows of `query` folded into `result` by `add` as they arrive, none of them held once
    /// it is folded in, on a connection of the pool that is watched for its close.
    func fold<Result: Sendable>(
        _ query: PostgresQuery, into result: Result,
        _ add: @escaping @Sendable (inout Result, PostgresRow) throws -> Void
    ) async throws -> Result {
        try await withWatchedConnection { connection in
            var result = result
            for try await row in try await connection.query(query, logger: PostgresStore.quiet) {
                try add(&result, row)
            }
            return result
        }
    }

    /// `body` on a connection of the pool, ending when that connection closes (see ``ClosedConnections``).
    func withWatchedConnection<T: Sendable>(
        closedError: @escaping @Sendable () -> any Error = { ConnectionClosed() },
        _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        try await withConnection { connection in
            try await ClosedConnections.run(on: connection, closedError: closedError, body)
        }
    }
}

/// The first result given to it, for the one caller that waits for it.
private final class Outcome<T: Sendable>: Sendable {
    private enum State {
        case pending
        case waiting(CheckedContinuation<T, any Error>)
        case finished(Result<T, any Error>)
        case told
    }

    private let state = Mutex<State>(.pending)

    /// Gives `result`, unless one was given before.
    func finish(_ result: Result<T, any Error>) {
        let waiting = state.withLock { state -> CheckedContinuation<T, any Error>? in
            switch state {
            case .pending:
                state = .finished(result)
                return nil
            case .waiting(let continuation):
                state = .told
                return continuation
            case .finished, .told:
                return nil
            }
        }
        waiting?.resume(with: result)
    }

    /// Waits for the first result.
    func value() async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let result = state.withLock { state -> Result<T, any Error>? in
                switch state {
                case .pending:
                    state = .waiting(continuation)
                    return nil
                case .finished(let result):
                    state = .told
                    return result
                case .waiting, .told:
                    // One caller waits, once.
                    return .failure(CancellationError())
                }
            }
            if let result { continuation.resume(with: result) }
        }
    }
}
