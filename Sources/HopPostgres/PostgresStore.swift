import Foundation
import HopStore
import Logging
import PostgresNIO
import Synchronization

/// Hop's data on a PostgreSQL server: the same runs, histories and subject state as a SQLite
/// ``HopStore``, shared by every engine of a fleet that reaches the server.
///
/// What it adds to a single file's guarantees:
/// - **Liveness.** An engine's incarnation holds a session-level advisory lock on a connection
///   of its own for as long as it lives; the server drops it with the connection, so another
///   engine proves the owner gone (its process died, its machine or network went away) and takes
///   its runs over at once, without waiting for their leases to expire.
/// - **Change notification.** The writes another engine must react to (a new run, an unhop, a
///   login, a logout, a cancel, a restart, a released run) send a `NOTIFY` on the channel
///   `hop_changes` with their transaction; every store `LISTEN`s on it, and ``changeVersion()``
///   moves when one arrives from another store. Nothing polls tables for changes.
/// - **Claims without contention.** Engines claim runs with `FOR UPDATE SKIP LOCKED`: N engines
///   resuming at once each take different runs, none waits on a row another is claiming.
///
/// Every write is one transaction, committed before the call returns (a `.coalesced` write too:
/// the server groups the log flushes of concurrent commits itself).
public final class PostgresStore: Sendable {
    /// The database, as given (its password is never shown: see ``PostgresURL/redacted``).
    public let url: PostgresURL
    /// The schema version of the database (the newest migration applied).
    public let schemaVersion: Int
    let client: PostgresClient
    let logger: Logger
    /// This store's name on the notification channel: its own notifications are not changes.
    let instance: String
    private let running: Task<Void, Never>
    let changes: ChangeListener
    /// The liveness locks of the incarnations made here, by owner value.
    let locks = Mutex<[String: WeakLock]>([:])
    /// The owners with a renewal waiting for rows another transaction holds (``renewLeases(owner:runIDs:until:)``).
    let renewalsWaiting = Mutex<Set<String>>([])
    /// The server's clock, as seen from here.
    let clock: ServerClock
    /// The object id of Hop's `runs` table when this store opened the database: the table is
    /// the same as long as the database is the one it opened (``checkNotReplaced(runsTable:operation:)``).
    let runsTable: Int64
    /// Set once this store found that the database is no longer the one it opened: from then on
    /// ``changeVersion()`` throws `.replaced`, so the engine's watch stops the engine at its next poll.
    let replaced = Atomic<Bool>(false)
    /// How many transactions of this store that may have written a deadline or a session's
    /// expiry have ended (committed, rolled back or failed): a look at what is due
    /// (``DueLook``) made before one of them may have missed what it wrote.
    let dueWritesEnded = Atomic<Int64>(0)
    /// The last look at the next deadline and the next session expiry (``nextDue()``).
    let dueLook = Mutex<DueLook?>(nil)
    /// How many looks at what comes due next this store made (``nextDue()``).
    package let dueLooks = Atomic<Int>(0)
    /// How long a look at what comes due next is trusted when nothing says it is out of date
    /// (``DueLook``): 1 s; tests set it longer, to see that the other signs are enough.
    package var dueLookEvery: Duration {
        get { dueLookInterval.withLock { $0 } }
        set { dueLookInterval.withLock { $0 = newValue } }
    }
    private let dueLookInterval = Mutex(Duration.seconds(1))

    /// The channel of change notifications.
    static let channel = "hop_changes"

    /// How long after the server starts (``serverAge``) no engine is taken for dead for want of
    /// its liveness lock (``releaseRunsOfDeadIncarnations(except:)``), and no lease is taken as
    /// run out (``leaseRunOut(grace:)``), in milliseconds: three times the longest pause between
    /// two tries of an engine to take its lock again (5 s), after which it renews its leases at
    /// once (``renewLeases(owner:runIDs:until:)``).
    static let graceAfterServerStart: Int64 = 15_000

    /// How long the server has been the one the engines reach, in milliseconds, as SQL: since an
    /// engine first found it answering after it started (its row in `server_starts`, written by
    /// ``recordServerStart()`` as an engine takes its liveness lock or looks for engines that are
    /// gone), and 0 until one has.
    ///
    /// Not since the server's own start (`pg_postmaster_start_time()`), which a failover does
    /// not reset: a standby promoted to primary started long before, and every engine's
    /// liveness lock is gone from it until the engine connects to it and takes its lock again.
    /// Counted from its start, the first engine to connect took the runs of the others as if
    /// they were dead, while they still ran their steps (`PostgresFailoverTests`).
    static let serverAge =
        "extract(epoch FROM clock_timestamp() - coalesce((SELECT s.first_seen_at FROM server_starts s"
        + " WHERE s.started_at = pg_postmaster_start_time()), clock_timestamp())) * 1000"

    /// When an engine first found the server answering since it started (its row in
    /// `server_starts`), in milliseconds since the Unix epoch, as SQL; `NULL` until one has
    /// (``serverAge``). A lease whose end has passed runs out ``graceAfterServerStart`` after it,
    /// not before (``leaseRunOut(grace:)``).
    static let serverFirstSeen =
        "(SELECT (extract(epoch FROM s.first_seen_at) * 1000)::bigint FROM server_starts s"
        + " WHERE s.started_at = pg_postmaster_start_time())"

    /// Whether the lease of a run (a row of `runs`) has run out, as SQL: its end has passed by
    /// the server's clock, and an engine first found the server answering (``serverAge``) more
    /// than ``graceAfterServerStart`` ago, which the statement binds to the placeholder `grace`.
    ///
    /// The server's clock moves on while the server is stopped or restarting, so when it is back
    /// after an outage longer than a lease, every lease of the fleet has run out. Without the
    /// grace, the engine back first took the runs the others were executing, and their steps
    /// ran a second time beside the first. With it, each owner has the time to take its liveness
    /// lock again and renew its leases. A run whose owner is gone is taken over once the grace
    /// has passed, or sooner when its owner's liveness lock says it is gone.
    static func leaseRunOut(grace: String) -> String {
        "(lease_expires_at < \(serverNow) AND \(serverAge) > \(grace))"
    }

    /// The server's clock, in milliseconds since the Unix epoch, as SQL. Leases are written and
    /// judged by it: the machines of a fleet need not agree on the time. (By the engines' own
    /// clocks, an engine whose clock was behind by more than a lease had every run it held
    /// taken over by the others while it went on executing them, and one whose clock was ahead
    /// kept its runs that long after it froze.)
    static let serverNow = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    /// How long a lease that ends at `until` (by ``now()``) lasts from now, in milliseconds: the
    /// length the server adds to its own clock (``serverNow``) when the statement that takes or
    /// renews the lease runs. Taken as the store is called, before the call waits for anything
    /// (the pool's connection, the owner's liveness lock, a row another client holds): taken
    /// after a wait, it was that much shorter, and one taken after a wait longer than the lease
    /// (a skipped run's renewal, behind another's that waited for its row) renewed a lease
    /// already over.
    func leaseLength(until: Date) -> Int64 { Clock.milliseconds(until) - Clock.milliseconds(now()) }

    /// The server's clock as this process last measured it (``ServerClock``): the time by which
    /// deadlines, step timeouts and session expiry are judged and records are dated, whatever
    /// this machine's clock says.
    package func now() -> Date { clock.now() }

    private init(
        url: PostgresURL, client: PostgresClient, running: Task<Void, Never>, changes: ChangeListener,
        instance: String, schemaVersion: Int, clock: ServerClock, runsTable: Int64, logger: Logger
    ) {
        self.url = url
        self.runsTable = runsTable
        self.clock = clock
        self.instance = instance
        self.client = client
        self.running = running
        self.changes = changes
        self.schemaVersion = schemaVersion
        self.logger = logger
    }

    deinit {
        changes.stop()
        running.cancel()
    }

    /// Opens the database at `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`), creating
    /// or upgrading Hop's schema in it unless `migrate` is false (then an outdated schema is refused).
    /// - Throws: ``HopError`` `.invalidInput` for a bad URL, `.postgres` when the server cannot be
    ///   reached or refuses, `.schemaTooNew`/`.migrationEdited`/`.schemaOutdated` as a file's open does.
    public static func open(
        url text: String, migrate: Bool = true,
        logger: Logger = Logger(label: "hop.store", factory: { _ in SwiftLogNoOpLogHandler() })
    ) async throws -> PostgresStore {
        try await open(url: try PostgresURL(text), migrate: migrate, logger: logger)
    }

    /// Opens the database `url` describes (see ``open(url:migrate:logger:)-(String,_,_)``).
    public static func open(
        url: PostgresURL, migrate: Bool = true,
        logger: Logger = Logger(label: "hop.store", factory: { _ in SwiftLogNoOpLogHandler() })
    ) async throws -> PostgresStore {
        var logger = logger
        logger[metadataKey: "hop.db"] = "\(url.redacted)"
        guard url.connectionLimit >= 1 else {
            throw HopError(
                .invalidInput, operation: "open", path: url.redacted,
                reason: "the connection limit \(url.connectionLimit) leaves the store no connection",
                hint: "Set PostgresURL.connectionLimit (connection_limit= in the URL) to 1 or more")
        }
        let client = PostgresClient(configuration: try url.clientConfiguration(), backgroundLogger: quiet)
        let running = Task { await client.run() }
        let changes = ChangeListener(url: url, logger: logger)
        do {
            // One connection first, so that a server that does not answer (or refuses the user)
            // fails the open at once rather than after the pool's retries.
            let instance = Token.random(byteCount: 8)
            do {
                try await changes.start(ignoring: instance)
            } catch {
                throw map(error, operation: "connect", location: url.redacted)
            }
            let version = try await PostgresMigrator(client: client, location: url.redacted, logger: quiet)
                .run(migrate: migrate)
            let clock = ServerClock(client: client)
            do {
                try await clock.start()
            } catch {
                throw map(error, operation: "read the server's clock", location: url.redacted)
            }
            let runsTable: Int64
            do {
                runsTable =
                    try await client.rows(of: PostgresValue.query("SELECT \(Self.runsTableNow)", []))
                    .first.map { try Row($0).int64(0) } ?? 0
            } catch {
                throw map(error, operation: "open", location: url.redacted)
            }
            logger.debug(
                "opened Hop database",
                metadata: [
                    "hop.schema": "\(version)", "hop.clock_offset_ms": "\(Int((clock.offset * 1000).rounded()))",
                ])
            return PostgresStore(
                url: url, client: client, running: running, changes: changes, instance: instance,
                schemaVersion: version, clock: clock, runsTable: runsTable, logger: logger)
        } catch {
            changes.stop()
            running.cancel()
            throw error
        }
    }

    /// The object id of Hop's `runs` table as the database has it now, as SQL.
    static let runsTableNow = "'runs'::regclass::oid::bigint"

    /// Throws `.replaced` when `oid`, the object id of Hop's `runs` table as a statement of this
    /// store just found it (``runsTableNow``, or the `tableoid` of a row of `runs`), is not the
    /// table this store opened: Hop's tables were dropped and created again since, by an operator
    /// restoring a backup while engines ran (`pg_restore --clean`, or a database dropped and
    /// restored under the same name). An engine that went on would write its runs as it knows
    /// them over the restored ones, whose histories end earlier: steps done again or skipped. So
    /// the write that found it changes nothing, and from then on ``changeVersion()`` throws too:
    /// the engine stops, and started again resumes every run from the database as it is now.
    ///
    /// A new table never takes the object id of one that existed before in the same cluster (the
    /// server counts them up); a backup restored into a cluster created again from nothing may, by
    /// chance, get the same: stop the engines before such a restore, as before any.
    func checkNotReplaced(runsTable oid: Int64, operation: String) throws {
        guard oid != runsTable else { return }
        replaced.store(true, ordering: .relaxed)
        throw replacedError(operation: operation)
    }

    /// The error of every call that finds the database replaced (``checkNotReplaced(runsTable:operation:)``).
    func replacedError(operation: String) -> HopError {
        HopError(
            .replaced, operation: operation, path: url.redacted,
            reason:
                "Hop's tables in the database were dropped and created again while this process had it open (a backup restored?): what it would write no longer matches the runs there, so it writes nothing more to them",
            hint:
                "Start the process again: it resumes every run from the database as it is now. To restore a backup, stop the engines first"
        )
    }

    /// Closes the store's connections. Engines on it must have stopped.
    public func close() async {
        changes.stop()
        running.cancel()
        await running.value
    }

    /// This store as the database of an engine.
    public var database: HopDatabase { HopDatabase(self) }

    /// A logger that logs nothing, for postgres-nio's own background messages.
    static let quiet = Logger(label: "hop.postgres", factory: { _ in SwiftLogNoOpLogHandler() })

    // MARK: Statements

    /// Runs `body` in one transaction (`BEGIN` … `COMMIT`, rolled back when it throws), again
    /// from the start when the server broke a deadlock by aborting it, when a lock wait was cut
    /// short by `lock_timeout` (``triesAgain(afterLockTimeout:since:attempt:)``), or
    /// when the connection was lost before `COMMIT` was sent (``isConnectionLost(_:)``: nothing
    /// of it was committed). A connection lost while committing is an error: whether the commit
    /// took is unknown.
    @discardableResult
    func transaction<Result: Sendable>(
        _ operation: String, _ body: @escaping @Sendable (PostgresTransaction) async throws -> Result
    ) async throws -> Result {
        let started = ContinuousClock.now
        var attempt = 0
        while true {
            attempt += 1
            // Set once the body is done: the COMMIT is then under way.
            let bodyDone = Atomic<Bool>(false)
            do {
                return try await client.withWatchedConnection(closedError: {
                    ConnectionClosed(whileCommitting: bodyDone.load(ordering: .relaxed))
                }) { connection in
                    try await connection.withTransaction(logger: Self.quiet) { connection in
                        let result = try await body(
                            PostgresTransaction(connection: connection, store: self, operation: operation))
                        bodyDone.store(true, ordering: .relaxed)
                        return result
                    }
                }
            } catch {
                let cause = Self.cause(of: error)
                if await Self.triesAgain(afterLockTimeout: cause, since: started, attempt: attempt) { continue }
                if attempt < Self.attempts {
                    if let failure = cause as? PSQLError, Self.isRetryable(failure) { continue }
                    let committing = (error as? PostgresTransactionError)?.commitError != nil
                    if !committing, Self.isConnectionLost(cause), await Self.pause(before: attempt + 1) { continue }
                }
                throw map(cause, operation: operation)
            }
        }
    }

    /// The plan the server makes for `sql` with `values` when a read of a whole table is priced
    /// out (`enable_seqscan` off): what a statement reads on a large database, whatever the
    /// statistics of a small one. For the tests that check that statements search their indexes.
    package func explain(_ sql: String, _ values: [PostgresValue]) async throws -> [String] {
        try await transaction("explain a statement") { tx in
            _ = try await tx.run("SET LOCAL enable_seqscan = off")
            return try await tx.query("EXPLAIN " + sql, values) { try $0.text(0) }
        }
    }

    /// Runs one read statement outside a transaction (``retried(_:_:)``).
    func read<T: Sendable>(
        _ sql: String, _ values: [PostgresValue] = [], operation: String,
        _ decode: @escaping @Sendable (Row) throws -> T
    ) async throws -> [T] {
        try await retried(operation) {
            try await client.fold(PostgresValue.query(sql, values), into: []) { $0.append(try decode(Row($1))) }
        }
    }

    /// Runs `statement`, one statement outside a transaction, again when the server broke a
    /// deadlock by aborting it (``isRetryable(_:)``), when `lock_timeout` cut its lock wait
    /// short (``triesAgain(afterLockTimeout:since:attempt:)``), or when its connection
    /// was lost before it was answered (``isConnectionLost(_:)``: on another connection of the
    /// pool, or on the same one taken again); its last error as a ``HopError`` naming `operation`.
    func retried<T>(_ operation: String, _ statement: () async throws -> T) async throws -> T {
        let started = ContinuousClock.now
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await statement()
            } catch {
                if await Self.triesAgain(afterLockTimeout: error, since: started, attempt: attempt) { continue }
                if attempt < Self.attempts {
                    if let failure = error as? PSQLError, Self.isRetryable(failure) { continue }
                    if Self.isConnectionLost(error), await Self.pause(before: attempt + 1) { continue }
                }
                throw map(error, operation: operation)
            }
        }
    }

    /// How many times a statement or a transaction is tried before its error is the caller's.
    static let attempts = 5

    /// How long, from its first try, a statement or a transaction whose lock wait a database's
    /// or role's `lock_timeout` cut short is tried again (with ``pause(before:)`` between tries);
    /// the first refusal is tried again whenever it comes.
    ///
    /// Hop's own transactions of one run lock its row (`FOR UPDATE`) and hold it until they
    /// commit: a wait of a commit's length, which a `lock_timeout` of 100 ms refuses on a loaded
    /// server, and an engine's write refused so stops its run, which resumes from its history (a
    /// step whose end was refused runs again). Tried again, such a wait is waited out. A lock
    /// held longer (an operator's `LOCK TABLE`, a `VACUUM FULL`) is still refused, as
    /// ``HopError/Code/busy``, after about this long or twice the `lock_timeout`, whichever is
    /// longer. The first refusal is always tried again, so that a process too loaded to handle
    /// it within this time (its own tasks waiting for a thread) still waits the lock out once.
    static let lockWaitBudget = Duration.seconds(1)

    /// Whether try `attempt` (the first is 1), failed with `error`, is tried again because
    /// `lock_timeout` refused it (``isLockTimeout(_:)``): the first try, or any within
    /// ``lockWaitBudget`` of `started` (the first try's start), after ``pause(before:)``.
    static func triesAgain(
        afterLockTimeout error: any Error, since started: ContinuousClock.Instant, attempt: Int
    ) async -> Bool {
        guard isLockTimeout(error), attempt == 1 || ContinuousClock.now - started < lockWaitBudget else {
            return false
        }
        return await pause(before: attempt + 1)
    }

    /// Whether `error` is the server's refusal of a lock wait that ran past `lock_timeout`
    /// (SQLSTATE 55P03; Hop takes no lock with `NOWAIT`, which fails with it too).
    static func isLockTimeout(_ error: any Error) -> Bool {
        (error as? PSQLError)?.serverInfo?[.sqlState] == "55P03"
    }

    /// Whether `error` says the connection went before the statement was done, so the server did
    /// nothing of it: the server restarted or ended the session (SQLSTATE class 57P: an
    /// operator's `pg_ctl restart`, `pg_terminate_backend`, a failover), the pool handed out a
    /// connection the server had just closed, or the server could not be reached while it
    /// restarted, or the connection closed before the statement was answered (``ConnectionClosed``,
    /// unless its transaction was committing). The statement runs again on another connection.
    static func isConnectionLost(_ error: any Error) -> Bool {
        if let closed = error as? ConnectionClosed { return !closed.whileCommitting }
        guard let error = error as? PSQLError else { return false }
        if let state = error.serverInfo?[.sqlState] { return state.hasPrefix("57P") }
        return error.code == .clientClosedConnection || error.code == .serverClosedConnection
            || error.code == .connectionError
    }

    /// Waits before attempt `attempt` (the second waits 50 ms, then twice as long each time:
    /// 0.75 s in all, about a restart of a server); `false` when the task was cancelled.
    static func pause(before attempt: Int) async -> Bool {
        let milliseconds = 50 << max(0, min(attempt - 2, 4))
        return (try? await Task.sleep(for: .milliseconds(milliseconds))) != nil
    }

    /// The first row of a read statement, if any.
    func readOne<T: Sendable>(
        _ sql: String, _ values: [PostgresValue] = [], operation: String,
        _ decode: @escaping @Sendable (Row) throws -> T
    ) async throws -> T? {
        try await read(sql, values, operation: operation, decode).first
    }

    /// What made a transaction fail: the body's error, else the failed `BEGIN`, `COMMIT` or rollback's.
    static func cause(of error: any Error) -> any Error {
        guard let failure = error as? PostgresTransactionError else { return error }
        return failure.closureError ?? failure.commitError ?? failure.beginError ?? failure.rollbackError ?? error
    }

    /// Whether the server aborted the transaction to break a deadlock or a serialization conflict.
    static func isRetryable(_ error: PSQLError) -> Bool {
        guard let state = error.serverInfo?[.sqlState] else { return false }
        // A deadlock broken, a serialization conflict, or two transactions inserting the same
        // subject's unfinished run at once: run again, the second sees the first's run.
        return state == "40P01" || state == "40001" || state == "23505"
    }

    /// `error` as a ``HopError`` naming `operation` and the database (never its password).
    func map(_ error: any Error, operation: String) -> HopError {
        Self.map(error, operation: operation, location: url.redacted)
    }

    package static func map(_ error: any Error, operation: String, location: String) -> HopError {
        let error = cause(of: error)
        if let error = error as? HopError { return error }
        if let error = error as? PSQLError {
            if let info = error.serverInfo {
                let message = info[.message] ?? "error"
                let state = info[.sqlState].map { " (SQLSTATE \($0))" } ?? ""
                if Self.isLockTimeout(error) {
                    // The database's or role's `lock_timeout` ran out: PostgreSQL's busy.
                    return HopError(
                        .busy, operation: operation, path: location,
                        reason:
                            "the database is busy: another session held a lock longer than its lock_timeout\(state)",
                        hint: info[.hint]
                            ?? "Try again; if it persists, check which session keeps a transaction open on Hop's tables (pg_stat_activity), or raise lock_timeout for Hop's role"
                    )
                }
                return HopError(
                    .postgres, operation: operation, path: location, reason: "the server refused: \(message)\(state)",
                    hint: info[.hint])
            }
            return HopError(
                .postgres, operation: operation, path: location,
                reason: "cannot talk to the server (\(error.code))",
                hint: "Check that PostgreSQL runs and that the URL's host, port, user and password are right")
        }
        if let error = error as? ConnectionClosed {
            return HopError(
                .postgres, operation: operation, path: location,
                reason: error.whileCommitting
                    ? "the connection to the server closed while committing: whether the change was made is unknown"
                    : "the connection to the server closed before the server answered",
                hint: "Check that PostgreSQL runs (a restart or an operator ending sessions closes connections)")
        }
        if error is CancellationError {
            return HopError(.postgres, operation: operation, path: location, reason: "cancelled")
        }
        // The client's pool gave up waiting for a connection: it could make none for a minute.
        // Its type is in PostgresNIO's underscored pool module (not a dependency of this one):
        // known by what it prints, which PostgresErrorTests checks.
        let printed = "\(error)"
        if printed.contains("connectionCreationCircuitBreakerTripped") {
            return HopError(
                .postgres, operation: operation, path: location,
                reason: "cannot connect to the server: every try for a minute failed",
                hint: "Check that PostgreSQL runs and that the URL's host, port, user and password are right")
        }
        if printed.contains("requestCancelled") {
            return HopError(.postgres, operation: operation, path: location, reason: "cancelled")
        }
        return HopError(.postgres, operation: operation, path: location, reason: printed)
    }

    func validate(_ value: String, as what: String) throws {
        try Identifier.validate(value, as: what, path: url.redacted)
    }

    func refuse(_ code: HopError.Code, _ operation: String, _ reason: String, hint: String? = nil) -> HopError {
        HopError(code, operation: operation, path: url.redacted, reason: reason, hint: hint)
    }
}

/// A weak reference to an incarnation's liveness lock: the lock lives as long as its incarnation.
struct WeakLock: Sendable {
    weak var lock: AdvisoryLock?
}

/// A value bound to a statement's parameter (`$1`, `$2`, …): never spliced into its text.
package enum PostgresValue: Sendable {
    case int(Int64)
    case text(String)
    case bool(Bool)
    case ints([Int64])
    case texts([String])
    case null

    static func optional(_ text: String?) -> PostgresValue { text.map(PostgresValue.text) ?? .null }
    static func optional(_ number: Int64?) -> PostgresValue { number.map(PostgresValue.int) ?? .null }

    /// `sql` with `values` bound to its parameters.
    static func query(_ sql: String, _ values: [PostgresValue]) -> PostgresQuery {
        var bindings = PostgresBindings(capacity: values.count)
        for value in values {
            switch value {
            case .int(let number): bindings.append(number)
            case .text(let text): bindings.append(text)
            case .bool(let flag): bindings.append(flag)
            case .ints(let numbers): bindings.append(numbers)
            case .texts(let texts): bindings.append(texts)
            case .null: bindings.appendNull()
            }
        }
        return PostgresQuery(unsafeSQL: sql, binds: bindings)
    }
}

/// One row of a result, read by column position.
struct Row {
    let cells: PostgresRandomAccessRow

    init(_ row: PostgresRow) { cells = row.makeRandomAccess() }

    func int64(_ index: Int) throws -> Int64 { try cells[index].decode(Int64.self) }
    func optionalInt64(_ index: Int) throws -> Int64? { try cells[index].decode(Int64?.self) }
    func text(_ index: Int) throws -> String { try cells[index].decode(String.self) }
    func optionalText(_ index: Int) throws -> String? { try cells[index].decode(String?.self) }
    func bool(_ index: Int) throws -> Bool { try cells[index].decode(Bool.self) }
}

extension HopDatabase {
    /// Opens the database `location` names: a `postgres://` URL opens a ``PostgresStore`` (a
    /// server shared by a fleet), anything else is the path of a SQLite file (a ``HopStore``).
    /// Hop's schema is created or upgraded in either.
    public static func open(
        _ location: String, logger: Logger = Logger(label: "hop.store", factory: { _ in SwiftLogNoOpLogHandler() })
    ) async throws -> HopDatabase {
        if PostgresURL.isPostgresURL(location) {
            return try await PostgresStore.open(url: location, logger: logger).database
        }
        return try await HopStore.open(path: location, logger: logger).database
    }
}
