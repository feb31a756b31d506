/// The one error type of HopStore: what failed, where, why SQLite said so, and what to do.
///
/// Match on ``kind``; print ``description`` for a person. Statement arguments never
/// appear in the message, so a session token cannot leak through an error.
public struct HopStoreError: Error, Sendable, CustomStringConvertible {
    /// What went wrong, in terms a caller can act on.
    public enum Kind: Sendable, Equatable {
        /// Another connection holds the write lock longer than the busy timeout.
        case busy
        /// The file is not a SQLite database, or it is damaged.
        case notADatabase
        /// The database file (or its folder) cannot be opened or created.
        case cannotOpen
        /// A read-only access found no database at the path.
        case missing
        /// The disk or the file system refused the write (full, read-only, I/O error).
        case ioFailure
        /// The database was created or upgraded by a newer Hop.
        case schemaTooNew
        /// The database's schema is older than this binary's and was opened without migrating.
        case schemaOutdated
        /// An applied migration no longer matches the one compiled into this binary.
        case migrationEdited
        /// An argument was refused before anything was written (identifier, JSON, limit).
        case invalidInput
        /// The run, flow or subject asked for does not exist.
        case notFound
        /// The change is not allowed in the run's current state (e.g. a second unhop).
        case refused
        /// Any other SQLite failure.
        case sqlite
    }

    /// What went wrong.
    public var kind: Kind
    /// What was being done, e.g. "unhop run 12" or "open".
    public var operation: String
    /// The database file concerned.
    public var path: String
    /// SQLite's extended result code, when SQLite reported the failure.
    public var resultCode: Int32?
    /// SQLite's own message, when SQLite reported the failure.
    public var sqliteMessage: String?
    /// What is wrong, in a sentence.
    public var reason: String
    /// What the reader can do about it.
    public var hint: String?

    public init(
        _ kind: Kind, operation: String, path: String, reason: String, hint: String? = nil,
        resultCode: Int32? = nil, sqliteMessage: String? = nil
    ) {
        self.kind = kind
        self.operation = operation
        self.path = path
        self.reason = reason
        self.hint = hint
        self.resultCode = resultCode
        self.sqliteMessage = sqliteMessage
    }

    /// Whether the database itself failed (I/O, a full disk, a busy lock, SQLite), rather than
    /// refusing a request or input: nothing was changed, and the same call may succeed later.
    public var isDatabaseFailure: Bool {
        switch kind {
        case .invalidInput, .refused, .notFound: false
        default: true
        }
    }

    /// What failed, where, why, and what to do, in one message.
    public var description: String {
        var text = "\(operation) failed (database \(path)): \(reason)"
        if let sqliteMessage, let resultCode {
            text += " [SQLite \(resultCode): \(sqliteMessage)]"
        }
        if let hint { text += ". \(hint)" }
        return text
    }
}
