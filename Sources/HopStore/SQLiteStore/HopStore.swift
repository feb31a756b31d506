import Logging

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Hop's persistent state in one SQLite file: runs and their hop history, first-use flags,
/// stored sessions and facts.
///
/// Guarantees: every public mutating method is one transaction. When it returns, the change
/// is committed and survives `kill -9` of the process (and, with ``Durability/full``, a power
/// cut). When it throws, nothing was changed. Every value reaches SQLite as a bound parameter.
///
/// The store runs its SQLite work on a thread of its own, so blocking I/O never occupies
/// Swift's cooperative pool.
///
/// ```swift
/// let store = try await HopStore.open(logger: logger)          // $HOP_DB or the default location
/// if try await store.isFirstUse(subject: "default", feature: "onboarding") { … }
/// ```
public actor HopStore {
    /// How much a commit survives.
    public enum Durability: Sendable {
        /// `synchronous=FULL`: a committed change survives a process crash and a power cut.
        case full
        /// `synchronous=NORMAL`: survives a process crash, not a power cut (the last commits may be lost).
        case normal
    }

    /// How a store is opened.
    public struct Options: Sendable {
        /// How much a commit survives; `.full` by default.
        public var durability: Durability = .full
        /// How long a write waits for another process's write lock before failing with `.busy`.
        public var busyTimeout: Duration = .seconds(5)
        /// Create the file (mode 0600, folder included) when it is missing. Off for read-only tools.
        public var createIfMissing = true
        /// Apply pending migrations. When off, a database whose schema is not current is refused.
        public var migrate = true
        /// The migrations to apply; every migration compiled into the binary by default.
        public var migrations: [Migration] = Migration.all
        /// The name of a registered SQLite VFS to open the file through (`nil`: SQLite's default,
        /// the unix VFS). For tests that inject I/O faults, or special file systems.
        /// See https://www.sqlite.org/vfs.html.
        public var vfs: String?
        /// How long a coalesced write (a run's decision, effect, unhop or completion, written by
        /// the engine) may wait for a commit when no other write commits it first. Until then it
        /// is applied and seen by this store, but a crash loses it (see the README's "Durability").
        public var commitDelay: Duration = .milliseconds(2)

        public init(
            durability: Durability = .full, busyTimeout: Duration = .seconds(5),
            createIfMissing: Bool = true, migrate: Bool = true
        ) {
            self.durability = durability
            self.busyTimeout = busyTimeout
            self.createIfMissing = createIfMissing
            self.migrate = migrate
        }
    }

    /// The store's own thread, where all its SQLite work runs.
    nonisolated let executor: StoreExecutor
    /// The store's thread, as the actor's executor.
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    let connection: Connection
    let logger: Logger
    /// Writes waiting for the next group transaction (see `transaction(_:_:)`).
    var pending: [PendingWrite] = []
    var flushScheduled = false
    /// The write transaction holding coalesced writes not yet committed, if one is open.
    var open: OpenTransaction?
    var transactionsOpened = 0
    /// Runs whose coalesced writes were lost when a commit failed: their later writes are
    /// refused until the run is claimed again (and its history read afresh).
    var lostRuns: Set<Int64> = []
    let commitDelay: Duration
    var statistics = CommitStatistics()
    /// The database file.
    public nonisolated let path: String
    /// The incarnations made over this store, whose heartbeats its waits for the write lock keep.
    nonisolated let heartbeats: Heartbeats
    /// The schema version of the database once opened.
    public nonisolated let schemaVersion: Int
    /// The options the store was opened with: a connection of its own (a snapshot's) opens the same way.
    nonisolated let options: Options

    private init(
        executor: StoreExecutor, connection: Connection, heartbeats: Heartbeats, schemaVersion: Int,
        options: Options, logger: Logger
    ) {
        self.executor = executor
        self.options = options
        self.heartbeats = heartbeats
        self.commitDelay = options.commitDelay
        self.connection = connection
        self.path = connection.path
        self.schemaVersion = schemaVersion
        self.logger = logger
    }

    deinit { executor.stop() }

    /// Opens (and by default creates and migrates) the database at `path`, or at
    /// ``DatabaseLocation/defaultPath(environment:)`` when `path` is `nil`.
    ///
    /// - Throws: ``HopError``: `.cannotOpen` for a folder or an unwritable place, `.missing`
    ///   when `createIfMissing` is off and there is no file, `.notADatabase`, `.schemaTooNew`,
    ///   `.migrationEdited`, `.schemaOutdated` when `migrate` is off. Nothing is changed then.
    public static func open(
        path: String? = nil, options: Options = Options(),
        logger: Logger = Logger(label: "hop.store", factory: { _ in SwiftLogNoOpLogHandler() })
    ) async throws -> HopStore {
        let path = path ?? DatabaseLocation.defaultPath()
        let executor = try StoreExecutor(name: "hop.store")
        do {
            return try await executor.perform {
                let connection = try Connection(
                    path: path, create: options.createIfMissing, durability: options.durability,
                    busyTimeout: options.busyTimeout, vfs: options.vfs)
                // An engine that waits for the write lock says so in its heartbeat, and a claim
                // takes no run from an owner that does (see `LivenessLocks`).
                let heartbeats = Heartbeats()
                connection.whileWaitingForALock { heartbeats.beat() }
                let waits = OwnerWaits(databasePath: path)
                try connection.define(function: "hop_owner_waits") { waits.answer($0) }
                connection.ownerWaits = waits
                let version: Int
                do {
                    version =
                        options.migrate
                        ? try Migrator.migrate(connection, migrations: options.migrations)
                        : try Migrator.verify(connection, migrations: options.migrations)
                } catch  where connection.createdFile {
                    // A database this call created and could not set up (a full disk): leave nothing.
                    connection.close()
                    throw DatabaseFile.discardCreated(path, after: error)
                }
                var logger = logger
                logger[metadataKey: "hop.db"] = "\(path)"
                logger.debug("opened Hop database", metadata: ["hop.schema": "\(version)"])
                return HopStore(
                    executor: executor, connection: connection, heartbeats: heartbeats, schemaVersion: version,
                    options: options, logger: logger)
            }
        } catch {
            executor.stop()
            throw error
        }
    }

    /// Runs SQLite's `PRAGMA integrity_check`; `["ok"]` for a sound database.
    public func integrityCheck() throws -> [String] {
        try connection.query("PRAGMA integrity_check", [], operation: "check integrity") { $0.text(0) }
    }

    // MARK: Shared checks

    func validate(_ value: String, as what: String) throws {
        try Identifier.validate(value, as: what, path: path)
    }

    func refuse(_ kind: HopError.Code, _ operation: String, _ reason: String, hint: String? = nil) -> HopError {
        HopError(kind, operation: operation, path: path, reason: reason, hint: hint)
    }
}

extension HopStore {
    /// SQLite's query plan for `sql`, one line per step: how a query will find its rows.
    func explain(_ sql: String) throws -> [String] {
        try connection.query("EXPLAIN QUERY PLAN " + sql, [], operation: "explain query") { $0.text(3) }
    }
}

extension HopStore {
    /// Copies the write-ahead log into the database file (`PRAGMA wal_checkpoint(TRUNCATE)`).
    public func checkpoint() throws {
        try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)", operation: "checkpoint")
    }
}

extension HopStore: HopStorage {
    /// The database file.
    package nonisolated var location: String { path }

    /// The store's thread: flow bodies run there, beside the database (see `StoreExecutor`).
    package nonisolated var flowExecutor: (any TaskExecutor)? { executor.flowExecutor }

    /// This machine's clock: every process using the file runs on it.
    package nonisolated func now() -> Date { Date() }

    /// A number that changes whenever another connection commits to the database
    /// (`PRAGMA data_version`): a cheap way to notice changes made by other processes.
    /// Throws `.replaced` once the file at the path is not the one the store opened (removed,
    /// or a backup put in its place): the changes of other processes go to that one.
    package func changeVersion() throws -> Int64 {
        try connection.checkInPlace(operation: "look for changes")
        return try connection.queryOne("PRAGMA data_version", [], operation: "read data version") { $0.int64(0) } ?? 0
    }

    package func checkSchema() throws {
        let newest = try connection.queryOne(
            "SELECT version, name FROM hop_migrations ORDER BY version DESC LIMIT 1", [],
            operation: "check the schema"
        ) { (version: Int($0.int64(0)), name: $0.text(1)) }
        try StorageRules(location: path).checkNotUpgraded(newest: newest, opened: schemaVersion)
    }
}
