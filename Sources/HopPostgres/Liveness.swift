import Foundation
import HopStore
import Logging
import PostgresNIO
import Synchronization

/// An incarnation's proof of liveness on PostgreSQL: a session-level advisory lock, keyed by the
/// 64 random bits of the incarnation's owner value, held on a connection of its own for as long
/// as the incarnation lives. The server drops it when the connection ends (the process died, its
/// machine or network went away), and another engine that no longer finds it in `pg_locks`
/// knows the owner is gone. A frozen process keeps its connection, hence its lock: its runs are
/// taken over only when their leases expire. A living process whose connection went takes the
/// lock again on a new one.
///
/// The lock is taken in the background; the store waits for it (``held()``) before it records
/// the incarnation as the owner of any run, so no run is ever held by an owner without its lock.
/// The incarnation's leases are renewed on the lock's connection, so they never wait for the
/// pool of connections its other statements share.
package final class AdvisoryLock: Sendable {
    /// The lock's key.
    let key: Int64
    private let state = LockState()
    /// Holds the lock; it captures the state, never this object, so the lock goes with its incarnation.
    private let task: Task<Void, Never>

    /// The condition on a row `l` of `pg_locks` that it is a granted liveness lock on `k.key` (a
    /// `bigint`) in this database: a one-key advisory lock, which the server shows as the key's
    /// high 32 bits (`classid`) and low 32 bits (`objid`). A constant clause, for every statement
    /// that looks for a liveness lock's holder.
    static let heldOnKey = """
        l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid::bigint = (k.key >> 32) & 4294967295 AND l.objid::bigint = k.key & 4294967295
        """

    /// The lock key of an owner value ending in `#` and 16 hex digits; `nil` for any other.
    package static func key(ofOwner owner: String) -> Int64? {
        guard let hash = owner.lastIndex(of: "#") else { return nil }
        let digits = owner[owner.index(after: hash)...]
        guard digits.count == 16, let value = UInt64(digits, radix: 16) else { return nil }
        return Int64(bitPattern: value)
    }

    init(key: Int64, url: PostgresURL, logger: Logger) {
        self.key = key
        let state = self.state
        task = Task { await Self.hold(key: key, url: url, logger: logger, state: state) }
    }

    deinit {
        task.cancel()  // closes the connection: the server lets go of the lock
    }

    /// Waits until the lock is held and returns the connection that holds it; throws when it
    /// could not be taken.
    @discardableResult
    func held() async throws -> PostgresConnection { try await state.held() }

    /// Connects, takes the lock and keeps the connection until cancelled (the incarnation ended).
    ///
    /// When the connection goes while the incarnation lives (a network blip, a restart or
    /// failover of the server, an operator ending sessions), the server lets go of the lock: it
    /// connects and takes it again at once, then with a growing pause while that fails, so that
    /// other engines go on seeing this one alive. Meanwhile it records no run as its own
    /// (``held()`` waits), and a run another engine took over in the gap is fenced as after a
    /// freeze: the engine stops executing it and writes nothing more to it. Failed tries are
    /// said as the engine's watch says its failed polls (``RepeatedFailures``): once, then
    /// every 10 s while they fail.
    private static func hold(key: Int64, url: PostgresURL, logger: Logger, state: LockState) async {
        let operation = "take the liveness lock"
        var everHeld = false
        // The failed tries since the lock was last held, and what the log was told of them.
        var failures = RepeatedFailures()
        while !Task.isCancelled {
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: try url.connectionConfiguration(), id: 1, logger: PostgresStore.quiet)
                do {
                    try await take(key: key, on: connection, logger: logger)
                } catch {
                    try? await connection.close()
                    throw error
                }
                // The grace after a restart or a failover starts with the first engine back. A
                // failure is no matter: the look for engines that are gone records it too.
                _ = try? await connection.rows(of: PostgresValue.query(PostgresStore.recordServerStartSQL, []))
                state.settle(.success(connection))
                if everHeld && failures.failures == 0 {
                    logger.notice(lockLines.over, metadata: ["hop.lock": "\(key)"])
                } else if everHeld {
                    failures.logSuccess(to: logger, lockLines, metadata: ["hop.lock": "\(key)"])
                }
                everHeld = true
                // Held until the incarnation ends: then the connection closes and the server lets go.
                await withTaskCancellationHandler {
                    await connection.keepAlive()
                } onCancel: {
                    connection.close().whenComplete { _ in }
                }
                if Task.isCancelled { return }
                state.lose()
                logger.warning(
                    "lost the connection holding this engine's liveness lock; connecting again to take it again (until then other engines may take its runs over, and it writes nothing more to those)",
                    metadata: ["hop.lock": "\(key)"])
            } catch {
                let failure = PostgresStore.map(error, operation: operation, location: url.redacted)
                // The first time, the engine's store is being opened: the error says why it cannot be.
                state.settle(.failure(failure), final: !everHeld)
                guard everHeld else { return }
                failures.log(failure, to: logger, lockLines, metadata: ["hop.lock": "\(key)"])
                try? await Task.sleep(for: .milliseconds(min(5000, 100 << min(failures.failures, 6))))
            }
        }
    }

    /// Takes the lock on `connection`, whatever the database's or role's `lock_timeout` (which
    /// applies again afterwards, to the renewals on this connection).
    ///
    /// Only a session of this incarnation's own can hold the key already: the one of a connection
    /// that went without the server noticing (a NAT or a firewall forgot it, the engine's end gave
    /// up on it). The server keeps that session, and the lock, until its TCP keep-alive gives up
    /// (hours by default): meanwhile the engine could claim no run and renew no lease. It is ended
    /// first (`pg_terminate_backend`, which a role may do to its own sessions) and the lock taken
    /// once it is gone. A role that may not end it (the old session is another role's, say after
    /// the URL's user changed) waits for the server to end it, and the log says so.
    private static func take(key: Int64, on connection: PostgresConnection, logger: Logger) async throws {
        // Watched: a statement written as the server ends the connection is never answered.
        let free = try await connection.rows(of: PostgresValue.query("SELECT pg_try_advisory_lock($1)", [.int(key)]))
        if try free.first?.decode(Bool.self) == true { return }
        let metadata: Logger.Metadata = ["hop.lock": "\(key)"]
        do {
            let ended = try await connection.rows(
                of: PostgresValue.query(
                    // Materialized: the server may not end any session before it is found to hold the key.
                    """
                    WITH holders AS MATERIALIZED (
                        SELECT l.pid FROM pg_locks l CROSS JOIN (SELECT $1::bigint AS key) AS k
                        WHERE \(AdvisoryLock.heldOnKey) AND l.pid <> pg_backend_pid()
                    )
                    SELECT pid FROM holders WHERE pg_terminate_backend(pid)
                    """, [.int(key)])
            ).map { try $0.decode(Int32.self) }
            if !ended.isEmpty {
                logger.warning(
                    "ended this engine's earlier session on the server (pid \(ended.map(String.init).joined(separator: ", "))), which still held its liveness lock: its connection went without the server noticing",
                    metadata: metadata)
            }
        } catch let error as PSQLError where error.serverInfo != nil {
            logger.warning(
                "cannot end the session on the server that still holds this engine's liveness lock (\(error.serverInfo?[.message] ?? "refused")); waiting until the server ends it (its TCP keep-alive gives up, hours by default unless tcp_keepalives_idle is set): meanwhile this engine claims no run and renews no lease",
                metadata: metadata)
        }
        // Waits for the old session to go: the wait's refusal by `lock_timeout` would only be tried again.
        _ = try await connection.rows(of: "SET lock_timeout = 0")
        _ = try await connection.rows(of: PostgresValue.query("SELECT pg_advisory_lock($1)", [.int(key)]))
        _ = try await connection.rows(of: "RESET lock_timeout")
    }
}

extension PostgresConnection {
    /// How long a connection HopPostgres keeps for itself (its liveness lock's, its listener's)
    /// may stay without a statement: as PostgresNIO's pool keeps its idle connections alive.
    static let keepAliveInterval = Duration.seconds(30)

    /// Returns once the connection closed. Meanwhile a statement runs on it every
    /// ``keepAliveInterval``, besides what else runs on it. An idle connection is the first a
    /// NAT or a firewall forgets (after minutes, for many), without either end knowing: on the
    /// liveness lock's, the server would keep the lock until its own TCP keep-alive gave up
    /// (hours by default), and the engine's next renewal on it would wait until the kernel gave
    /// up on the connection, while the leases ran out; on the listener's, notifications would
    /// stop coming for good. A keep-alive that fails closes the connection, and its owner
    /// connects again.
    func keepAlive() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await self.closeFuture.get() }
            group.addTask {
                while (try? await Task.sleep(for: Self.keepAliveInterval)) != nil {
                    do {
                        _ = try await self.rows(of: "SELECT 1")
                    } catch {
                        try? await self.close()
                        return
                    }
                }
            }
            await group.next()
            group.cancelAll()
        }
    }
}

/// What ``AdvisoryLock`` says while it cannot take its lock again.
private let lockLines = RepeatedFailures.Lines(
    first: "cannot take this engine's liveness lock again; trying again, with a growing pause up to 5 s",
    still: "this engine's liveness lock still cannot be taken again",
    over: "took this engine's liveness lock again on a new connection", level: .warning)

/// What ``ChangeListener`` says while it cannot listen again, and once it does.
private let listenLines = RepeatedFailures.Lines(
    first: "cannot listen for changes; connecting again, with a growing pause up to 2 s",
    still: "still cannot listen for changes",
    over: "listening for changes again", level: .warning)

/// Whether an ``AdvisoryLock`` is held yet, and who waits for it.
private final class LockState: Sendable {
    private typealias Waiter = CheckedContinuation<PostgresConnection, any Error>

    private enum State {
        /// Those waiting, by the number each was given.
        case acquiring([Int: Waiter])
        /// On this connection.
        case held(PostgresConnection)
        case failed(HopError)
    }

    private let state = Mutex<(state: State, nextWaiter: Int)>((.acquiring([:]), 0))

    /// Waits until the lock is held and returns its connection; throws the error of a final
    /// failure to take it, or `CancellationError` when the task is cancelled before (an engine
    /// that stops while the server is away must not wait for it to come back).
    func held() async throws -> PostgresConnection {
        let number = state.withLock { state in
            defer { state.nextWaiter += 1 }
            return state.nextWaiter
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: Waiter) in
                let outcome = state.withLock { state -> Result<PostgresConnection, any Error>? in
                    switch state.state {
                    case .acquiring(var waiting):
                        // Cancelled before it could wait: the handler below found nothing to end.
                        if Task.isCancelled { return .failure(CancellationError()) }
                        waiting[number] = continuation
                        state.state = .acquiring(waiting)
                        return nil
                    case .held(let connection): return .success(connection)
                    case .failed(let error): return .failure(error)
                    }
                }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard case .acquiring(var waiting) = state.state else { return nil }
                let waiter = waiting.removeValue(forKey: number)
                state.state = .acquiring(waiting)
                return waiter
            }
            waiter?.resume(throwing: CancellationError())
        }
    }

    /// Ends an attempt to take the lock: those waiting are told how it went. A failure that is
    /// `final` fails every later wait too; another leaves the next attempt to be waited for.
    func settle(_ outcome: Result<PostgresConnection, HopError>, final: Bool = true) {
        let waiting = state.withLock { state -> [Waiter] in
            guard case .acquiring(let waiting) = state.state else { return [] }
            switch outcome {
            case .success(let connection): state.state = .held(connection)
            case .failure(let error): state.state = final ? .failed(error) : .acquiring([:])
            }
            return Array(waiting.values)
        }
        for continuation in waiting { continuation.resume(with: outcome.mapError { $0 as any Error }) }
    }

    /// The lock's connection went: waits are for the next attempt to take it again.
    func lose() {
        state.withLock { state in
            if case .held = state.state { state.state = .acquiring([:]) }
        }
    }
}

/// Moves ``PostgresStore/changeVersion()`` when another store notifies a change: `LISTEN` on a
/// connection of its own. When that connection drops it connects again, and counts a change
/// (notifications sent meanwhile were lost), so an engine looks at the database again.
///
/// While it cannot connect (the server is stopped, restarting, failing over), it tries again
/// after 0.2 s, then twice as long each time up to 2 s, and says so once, then every 10 s
/// (``RepeatedFailures``), and once more when it listens again. Before, it said so and tried
/// again every 0.2 s: 18,000 lines an hour of an outage, from every engine of a fleet.
final class ChangeListener: Sendable {
    private let url: PostgresURL
    private let logger: Logger
    private let version = Mutex<Int64>(0)
    private let ready = Mutex<(listening: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))
    private let task = Mutex<Task<Void, Never>?>(nil)
    /// The store's own name on the channel: its notifications are not changes to it.
    private let instance = Mutex<String>("")
    /// Failed tries since the last time it listened, as said in the log.
    private let failures = Mutex(RepeatedFailures())

    init(url: PostgresURL, logger: Logger) {
        self.url = url
        self.logger = logger
    }

    /// The number of changes other stores notified (and of reconnections).
    var current: Int64 { version.withLock { $0 } }

    /// Starts listening for changes other than `instance`'s; returns once listening.
    func start(ignoring instance: String) async throws {
        self.instance.withLock { $0 = instance }
        // Connect once here, so that a bad URL or an unreachable server fails the open.
        let connection = try await PostgresConnection.connect(
            configuration: try url.connectionConfiguration(), id: 2, logger: PostgresStore.quiet)
        task.withLock { $0 = Task { [weak self] in await self?.listen(first: connection) } }
        await withCheckedContinuation { continuation in
            let listening = ready.withLock { ready -> Bool in
                if ready.listening { return true }
                ready.waiting.append(continuation)
                return false
            }
            if listening { continuation.resume() }
        }
    }

    func stop() {
        task.withLock { $0?.cancel() }
    }

    private func listen(first: PostgresConnection) async {
        var connection: PostgresConnection? = first
        while !Task.isCancelled {
            do {
                let current: PostgresConnection
                if let connection {
                    current = connection
                } else {
                    current = try await PostgresConnection.connect(
                        configuration: try url.connectionConfiguration(), id: 2, logger: PostgresStore.quiet)
                }
                connection = nil
                let own = instance.withLock { $0 }
                try await withThrowingTaskGroup(of: Void.self) { group in
                    // A NAT forgets an idle connection without a word: notifications would stop for good.
                    group.addTask { await current.keepAlive() }
                    // However listening ends; the keep-alive returns once the connection closed.
                    defer { current.close().whenComplete { _ in } }
                    try await withTaskCancellationHandler {
                        try await current.listen(on: PostgresStore.channel) { notifications in
                            // Listening now: notifications committed from here on arrive.
                            version.withLock { $0 += 1 }
                            failures.withLock { $0.logSuccess(to: logger, listenLines) }
                            let waiting = ready.withLock { ready in
                                ready.listening = true
                                defer { ready.waiting = [] }
                                return ready.waiting
                            }
                            for continuation in waiting { continuation.resume() }
                            for try await notification in notifications where notification.payload != own {
                                version.withLock { $0 += 1 }
                            }
                        }
                    } onCancel: {
                        current.close().whenComplete { _ in }
                    }
                }
            } catch {
                if Task.isCancelled { break }
                let failure = PostgresStore.map(error, operation: "listen for changes", location: url.redacted)
                let tries = failures.withLock { said in
                    said.log(failure, to: logger, listenLines)
                    return said.failures
                }
                try? await Task.sleep(for: .milliseconds(min(2000, 100 << min(tries, 5))))
            }
        }
        // Whoever still waits for the first LISTEN is let go (the store is closing).
        let waiting = ready.withLock { ready in
            defer { ready.waiting = [] }
            return ready.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}
