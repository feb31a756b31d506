internal import CSQLite

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// One SQLite connection: opened with Hop's pragmas, its statements cached.
///
/// Not `Sendable`: a connection belongs to the ``HopStore`` actor that owns it and is
/// only used on that actor's thread.
final class Connection {
    let path: String
    private let handle: OpaquePointer
    private var cache: [String: Statement] = [:]
    /// The handler that waits for another process's lock (installed on `handle`).
    private let busyWait: BusyWait

    /// Whether this connection created the database file (it was missing).
    let createdFile: Bool
    /// The SQL function `hop_owner_waits`, once the store has defined it (see `OwnerWaits`).
    var ownerWaits: OwnerWaits?

    /// The size a write-ahead log is cut back to once checkpointed (`PRAGMA journal_size_limit`).
    /// A log grows past SQLite's checkpoint of every 1,000 pages (4 MiB) while another process
    /// reads a snapshot for long (a backup, a `sqlite3` shell); without a limit SQLite keeps the
    /// file at its largest for as long as a connection stays open, a daemon's for months. A
    /// daemon's log in use stays well below it, so it is never cut and grown again.
    static let walSizeLimit: Int64 = 16 << 20

    /// Opens the database at `path`, creating it (mode 0600, folder included) when `create` is set.
    /// Only a regular file is adopted, never through a symbolic link (see `DatabaseFile`).
    init(path: String, create: Bool, durability: HopStore.Durability, busyTimeout: Duration, vfs: String? = nil) throws
    {
        self.path = path
        createdFile = try DatabaseFile.adopt(path, create: create)
        var opened: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE | SQLITE_OPEN_NOFOLLOW
        let code = sqlite3_open_v2(path, &opened, flags, vfs)
        guard code == SQLITE_OK, let opened else {
            let message = opened.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(opened)
            let error = Self.error(code: code, message: message, operation: "open", path: path)
            throw createdFile ? DatabaseFile.discardCreated(path, after: error) : error
        }
        handle = opened
        sqlite3_extended_result_codes(handle, 1)
        busyWait = BusyWait(timeout: busyTimeout)
        busyWait.install(on: handle)
        do {
            // Reading the schema first turns "not a database" into a clear error before any pragma writes.
            let tables = try queryOne("SELECT count(*) FROM sqlite_schema", [], operation: "open") { $0.int64(0) }
            // A new database frees the pages of pruned runs a few at a time (`HopStore.prune`);
            // the mode can only be chosen before the first table exists.
            if tables == 0 { try execute("PRAGMA auto_vacuum = INCREMENTAL", operation: "open") }
            try setWAL(timeout: busyTimeout)
            try execute("PRAGMA journal_size_limit = \(Self.walSizeLimit)", operation: "open")
            try execute("PRAGMA synchronous = \(durability == .full ? "FULL" : "NORMAL")", operation: "open")
            try execute("PRAGMA foreign_keys = ON", operation: "open")
        } catch {
            cache.removeAll()
            sqlite3_close_v2(handle)
            throw createdFile ? DatabaseFile.discardCreated(path, after: error) : error
        }
    }

    /// Calls `body` as each wait for another process's lock begins, and every quarter of a
    /// second while it lasts (on the connection's thread, inside the SQLite call that waits).
    func whileWaitingForALock(_ body: @escaping () -> Void) {
        busyWait.whileWaiting = body
    }

    /// Defines the SQL function `name(text)` on this connection as `body`, whose answer is an
    /// integer (`NULL` arrives as `nil`). Direct only: no trigger or view of a database can call it.
    func define(function name: String, _ body: @escaping (String?) -> Int64) throws {
        final class Box {
            let body: (String?) -> Int64
            init(_ body: @escaping (String?) -> Int64) { self.body = body }
        }
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        let code = sqlite3_create_function_v2(
            handle, name, 1, SQLITE_UTF8 | SQLITE_DIRECTONLY, box,
            { context, count, values in
                guard let context, let data = sqlite3_user_data(context) else { return }
                let box = Unmanaged<Box>.fromOpaque(data).takeUnretainedValue()
                var argument: String?
                if count > 0, let value = values?[0], let text = sqlite3_value_text(value) {
                    argument = String(cString: text)
                }
                sqlite3_result_int64(context, box.body(argument))
            }, nil, nil,
            { data in
                if let data { Unmanaged<Box>.fromOpaque(data).release() }
            })
        guard code == SQLITE_OK else { throw failure(code, operation: "define the SQL function \(name)") }
    }

    private var isClosed = false

    deinit { close() }

    /// Finalizes the cached statements and closes the connection (once; `deinit` does it otherwise).
    func close() {
        guard !isClosed else { return }
        isClosed = true
        cache.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Switches to WAL; a fresh file opened by two processes at once may report busy here even with a busy timeout.
    private func setWAL(timeout: Duration) throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            do {
                let mode = try query("PRAGMA journal_mode = WAL", [], operation: "open") { $0.text(0) }.first
                guard mode?.lowercased() == "wal" else {
                    throw HopError(
                        .ioFailure, operation: "open", path: path,
                        reason:
                            "the database could not be switched to WAL journaling (it reports \(mode ?? "nothing"))",
                        hint: "Put the database on a local file system that supports shared memory")
                }
                return
            } catch let error as HopError where error.code == .busy && ContinuousClock.now < deadline {
                usleep(2_000)
            }
        }
    }

    // MARK: Statements

    /// Runs static SQL, possibly several statements, binding nothing. For schema and pragmas only.
    func execute(_ sql: String, operation: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &message)
        if code != SQLITE_OK {
            let text = message.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(handle))
            sqlite3_free(message)
            throw Self.error(code: code, message: text, operation: operation, path: path)
        }
    }

    private func prepared(_ sql: String, operation: String) throws -> Statement {
        if let statement = cache[sql] { return statement }
        var raw: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &raw, nil)
        guard code == SQLITE_OK, let raw else {
            throw failure(code, operation: operation)
        }
        let statement = Statement(handle: raw, sql: sql)
        cache[sql] = statement
        return statement
    }

    /// Runs one statement that returns no rows; returns the number of rows it changed.
    @discardableResult
    func run(_ sql: String, _ arguments: [SQLValue], operation: String) throws -> Int {
        let statement = try prepared(sql, operation: operation)
        defer { sqlite3_reset(statement.handle) }
        let bound = statement.bind(arguments)
        guard bound == SQLITE_OK else { throw failure(bound, operation: operation) }
        var code = sqlite3_step(statement.handle)
        while code == SQLITE_ROW { code = sqlite3_step(statement.handle) }
        guard code == SQLITE_DONE else { throw failure(code, operation: operation) }
        return Int(sqlite3_changes(handle))
    }

    /// Runs one statement and maps each row it returns.
    func query<T>(_ sql: String, _ arguments: [SQLValue], operation: String, _ map: (Row) throws -> T) throws -> [T] {
        var rows: [T] = []
        try forEachRow(sql, arguments, operation: operation) { rows.append(try map($0)) }
        return rows
    }

    /// Runs one statement and hands each row it returns to `body`, keeping none: for statements
    /// that return more rows than should be held at once.
    func forEachRow(_ sql: String, _ arguments: [SQLValue], operation: String, _ body: (Row) throws -> Void) throws {
        let statement = try prepared(sql, operation: operation)
        defer { sqlite3_reset(statement.handle) }
        let bound = statement.bind(arguments)
        guard bound == SQLITE_OK else { throw failure(bound, operation: operation) }
        while true {
            let code = sqlite3_step(statement.handle)
            if code == SQLITE_DONE { return }
            guard code == SQLITE_ROW else { throw failure(code, operation: operation) }
            try body(Row(handle: statement.handle))
        }
    }

    /// A cursor over the rows of `sql`: a read too large to hold, taken a page at a time with
    /// the caller free to wait between pages. Its statement is its own (not the cache's) and stays
    /// open until the cursor goes; run it inside a transaction, which keeps its pages one snapshot.
    func cursor(_ sql: String, _ arguments: [SQLValue], operation: String) throws -> Cursor {
        var raw: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, 0, &raw, nil)
        guard code == SQLITE_OK, let raw else { throw failure(code, operation: operation) }
        let statement = Statement(handle: raw, sql: sql)
        let bound = statement.bind(arguments)
        guard bound == SQLITE_OK else { throw failure(bound, operation: operation) }
        return Cursor(connection: self, statement: statement, operation: operation)
    }

    /// The rows of a statement, stepped a page at a time (``Connection/cursor(_:_:operation:)``).
    final class Cursor {
        private let connection: Connection
        private let statement: Statement
        private let operation: String
        private var done = false

        fileprivate init(connection: Connection, statement: Statement, operation: String) {
            self.connection = connection
            self.statement = statement
            self.operation = operation
        }

        /// The next rows, at most `limit`, each mapped by `map`; none once every row was read.
        func next<T>(_ limit: Int, _ map: (Row) throws -> T) throws -> [T] {
            var rows: [T] = []
            while !done && rows.count < limit {
                let code = sqlite3_step(statement.handle)
                if code == SQLITE_DONE {
                    done = true
                    sqlite3_reset(statement.handle)
                } else if code == SQLITE_ROW {
                    rows.append(try map(Row(handle: statement.handle)))
                } else {
                    let error = connection.failure(code, operation: operation)
                    done = true
                    sqlite3_reset(statement.handle)
                    throw error
                }
            }
            return rows
        }
    }

    /// The first row of a query, if any.
    func queryOne<T>(_ sql: String, _ arguments: [SQLValue], operation: String, _ map: (Row) throws -> T) throws -> T? {
        try query(sql, arguments, operation: operation, map).first
    }

    var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// How many rows the connection's statements have inserted, updated or deleted since it
    /// opened, less those rolled back to a savepoint: a write that leaves it unchanged changed nothing.
    var totalChanges: Int64 { sqlite3_total_changes64(handle) - undoneChanges }
    private var undoneChanges: Int64 = 0

    /// The lowest id a new run may take (0: any): one above every run whose records this store
    /// lost in a failed commit, so that a lost run's id never names another run.
    var runIDFloor: Int64 = 0

    /// Whether the transaction open at `mark` (a ``totalChanges``) is still open and nothing
    /// changed since: a write that failed then can fail alone, without a savepoint to undo it.
    func changedNothing(since mark: Int64) -> Bool { totalChanges == mark && isInTransaction }

    /// Counts the changes made since `mark` (a ``totalChanges``) as undone: a savepoint taken
    /// at `mark` was rolled back.
    func undoChanges(since mark: Int64) { undoneChanges += totalChanges - mark }

    // MARK: Transactions

    /// Runs `body` in one write transaction, begun IMMEDIATE so that the write lock is taken
    /// (or the busy timeout spent) before anything is read. Commits when `body` returns,
    /// rolls back when it throws: a failed call changes nothing.
    /// Migrations and the store's group commit both write through it.
    @discardableResult
    func write<T>(_ operation: String, _ body: () throws -> T) throws -> T {
        try run("BEGIN IMMEDIATE", [], operation: operation)
        let result: T
        do {
            result = try body()
            try commit(operation)
        } catch {
            rollback()
            throw error
        }
        return result
    }

    /// Commits the open transaction, unless the database file was removed or replaced since
    /// this connection opened it (``checkInPlace(operation:)``): SQLite would commit, in WAL
    /// mode, to the file it has open, which no other process sees any more.
    func commit(_ operation: String) throws {
        try checkInPlace(operation: operation)
        try run("COMMIT", [], operation: operation)
    }

    /// Throws `.replaced` when the file at ``path`` is no longer the one this connection opened:
    /// removed, or another put in its place (an operator restoring a backup while the process
    /// runs). SQLite goes on reading and writing the file it opened, without a word. One
    /// `stat` of the path (`SQLITE_FCNTL_HAS_MOVED`); a file system that cannot tell passes.
    func checkInPlace(operation: String) throws {
        var moved: Int32 = 0
        guard sqlite3_file_control(handle, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK, moved != 0 else {
            return
        }
        throw HopError(
            .replaced, operation: operation, path: path,
            reason:
                "the database file was removed or replaced while this process had it open: what it writes would be lost, so it writes nothing more",
            hint:
                "Start the process again: it opens the file now at the path. To restore a backup, stop the daemons first"
        )
    }

    /// Rolls back the open transaction, if any.
    func rollback() {
        if sqlite3_get_autocommit(handle) == 0 {
            sqlite3_exec(handle, "ROLLBACK", nil, nil, nil)
        }
    }

    /// Whether a transaction is open on this connection (SQLite ends one by itself after some
    /// errors: a full disk, an I/O error).
    var isInTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    /// Runs `body` in one read transaction: a consistent snapshot that never blocks writers.
    /// Inside the store's open write transaction (coalesced writes), `body` reads within it.
    func read<T>(_ operation: String, _ body: () throws -> T) throws -> T {
        if isInTransaction { return try body() }
        try run("BEGIN DEFERRED", [], operation: operation)
        defer { rollback() }
        return try body()
    }

    // MARK: Errors

    fileprivate func failure(_ code: Int32, operation: String) -> HopError {
        Self.error(code: code, message: String(cString: sqlite3_errmsg(handle)), operation: operation, path: path)
    }

    static func error(code: Int32, message: String, operation: String, path: String) -> HopError {
        let primary = code & 0xff
        let kind: HopError.Code
        let reason: String
        let hint: String?
        switch primary {
        case SQLITE_BUSY, SQLITE_LOCKED:
            kind = .busy
            reason = "the database is busy: another process holds its write lock"
            hint = "Try again; if it persists, check which process keeps a write transaction open"
        case SQLITE_NOTADB, SQLITE_CORRUPT:
            kind = .notADatabase
            reason = "the file is not a Hop database or is damaged"
            hint = "Check the path (--db, $HOP_DB), or restore the file from a backup"
        case SQLITE_CANTOPEN:
            kind = .cannotOpen
            reason = "the database file cannot be opened"
            hint = "Check that the path is a file (not a folder) and that its folder exists and is writable"
        case SQLITE_FULL:
            kind = .ioFailure
            reason = "the disk is full"
            hint = "Free space on the disk holding the database; nothing was changed"
        case SQLITE_IOERR, SQLITE_READONLY, SQLITE_PERM:
            kind = .ioFailure
            reason = "the file system refused to read or write the database"
            hint = "Check the disk, the file's permissions and that the file system is writable; nothing was changed"
        case SQLITE_CONSTRAINT:
            kind = .refused
            reason = "the change conflicts with what is stored"
            hint = nil
        default:
            kind = .sqlite
            reason = "SQLite reported an error"
            hint = nil
        }
        return HopError(
            kind, operation: operation, path: path, reason: reason, hint: hint, resultCode: code, sqliteMessage: message
        )
    }
}
