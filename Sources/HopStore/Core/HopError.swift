/// The one error type of Hop's public API, from the database up to the engine: what failed,
/// where, why, and what to do.
///
/// Match on ``code``; print ``description`` for a person. Codes are values, not enum cases, so a
/// later release can add one without breaking a caller's `switch` (which must have a `default`).
/// Statement arguments never appear in a message, so a session token cannot leak through an error.
///
/// ```swift
/// do {
///     try await engine.unhop(flow: "startup", subject: "kiosk-7", step: "onboarding")
/// } catch let error as HopError where error.code == .refused {
///     print(error)  // why, and what to do instead
/// }
/// ```
public struct HopError: Error, Sendable, CustomStringConvertible {
    /// What went wrong, in terms a caller can act on.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// The code's name, e.g. `"refused"`.
        public let name: String

        private init(_ name: String) { self.name = name }

        public var description: String { name }

        // MARK: The database

        /// Another connection holds the write lock longer than the busy timeout (on PostgreSQL,
        /// another session a lock longer than the database's or role's `lock_timeout`, through
        /// its tries: about a second, or twice the `lock_timeout`).
        public static let busy = Code("busy")
        /// The file is not a SQLite database, or it is damaged.
        public static let notADatabase = Code("notADatabase")
        /// The database file (or its folder) cannot be opened or created.
        public static let cannotOpen = Code("cannotOpen")
        /// A read-only access found no database at the path.
        public static let missing = Code("missing")
        /// The disk or the file system refused the write (full, read-only, I/O error).
        public static let ioFailure = Code("ioFailure")
        /// The database file was removed, or another file put in its place (a backup restored),
        /// while this process had it open: it still reads and writes the file it opened, which
        /// nobody else sees any more, so it writes nothing more. Start the process again: it
        /// opens the file now at the path. On PostgreSQL: Hop's tables were dropped and created
        /// again (a backup restored with `pg_restore --clean`, a database dropped and restored
        /// under its name) while this process had the database open; what it knows of its runs
        /// no longer matches the restored ones, so it writes nothing more to them. Start the
        /// process again: it resumes every run from the database as it is now.
        public static let replaced = Code("replaced")
        /// The database was created or upgraded by a newer Hop.
        public static let schemaTooNew = Code("schemaTooNew")
        /// The database's schema is older than this binary's and was opened without migrating.
        public static let schemaOutdated = Code("schemaOutdated")
        /// An applied migration no longer matches the one compiled into this binary.
        public static let migrationEdited = Code("migrationEdited")
        /// Any other failure of the database.
        public static let sqlite = Code("sqlite")
        /// PostgreSQL refused or failed a statement, or its server could not be reached.
        public static let postgres = Code("postgres")

        // MARK: Requests

        /// An argument was refused before anything was written (identifier, JSON, limit).
        public static let invalidInput = Code("invalidInput")
        /// The run, flow or subject asked for does not exist.
        public static let notFound = Code("notFound")
        /// The change is not allowed in the run's current state (e.g. a second unhop); nothing changed.
        public static let refused = Code("refused")

        // MARK: Flows

        /// No flow or step is registered under the name.
        public static let notRegistered = Code("notRegistered")
        /// The flow code asked for a different path than the run's history.
        public static let diverged = Code("diverged")
        /// A step threw on its last attempt; the run is failed.
        public static let stepFailed = Code("stepFailed")
        /// A value could not be encoded or decoded as JSON.
        public static let encoding = Code("encoding")
    }

    /// What went wrong.
    public var code: Code
    /// What was being done, e.g. "unhop run 12" or "open"; `nil` for an error of the engine itself.
    public var operation: String?
    /// The database concerned, when the database failed or refused.
    public var path: String?
    /// SQLite's extended result code, when SQLite reported the failure.
    public var resultCode: Int32?
    /// SQLite's own message, when SQLite reported the failure.
    public var sqliteMessage: String?
    /// What is wrong, in a sentence.
    public var reason: String
    /// What the reader can do about it.
    public var hint: String?

    /// An error of a database operation.
    public init(
        _ code: Code, operation: String, path: String, reason: String, hint: String? = nil,
        resultCode: Int32? = nil, sqliteMessage: String? = nil
    ) {
        self.code = code
        self.operation = operation
        self.path = path
        self.reason = reason
        self.hint = hint
        self.resultCode = resultCode
        self.sqliteMessage = sqliteMessage
    }

    /// An error of the engine: `reason` says what is wrong and `hint` what to do.
    public init(_ code: Code, _ reason: String, hint: String? = nil) {
        self.code = code
        self.reason = reason
        self.hint = hint
    }

    /// Whether the database itself failed (I/O, a full disk, a busy lock, SQLite), rather than
    /// refusing a request or input or a flow going wrong: nothing was changed. ``mayPass`` says
    /// whether the same call may succeed later without anyone acting.
    public var isDatabaseFailure: Bool {
        switch code {
        case .busy, .notADatabase, .cannotOpen, .missing, .ioFailure, .replaced, .schemaTooNew, .schemaOutdated,
            .migrationEdited, .sqlite, .postgres:
            true
        default: false
        }
    }

    /// Whether the same call may succeed later without anyone doing anything: the database
    /// was busy, the disk or the file system failed, SQLite failed otherwise, or PostgreSQL did
    /// (its server may come back). Not when there is no database, the file is damaged or its
    /// schema is not this binary's: an operator has to act.
    public var mayPass: Bool {
        switch code {
        case .busy, .ioFailure, .sqlite, .postgres: true
        default: false
        }
    }

    /// What failed, where, why, and what to do, in one message.
    public var description: String {
        var text = reason
        if let operation {
            text = "\(operation) failed" + (path.map { " (database \($0))" } ?? "") + ": \(reason)"
        }
        if let sqliteMessage, let resultCode {
            text += " [SQLite \(resultCode): \(sqliteMessage)]"
        }
        if let hint { text += ". \(hint)" }
        return text
    }
}
