import CSQLite
import Foundation

/// The physical baseline: SQLite's C API with prepared statements, no Hop in between.
final class RawSQLite {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    private var handle: OpaquePointer?
    private var statements: [String: OpaquePointer] = [:]
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    init(path: String, synchronous: String) throws {
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(handle)
            throw Failure(description: "cannot open \(path): \(message)")
        }
        sqlite3_busy_timeout(handle, 5000)
        try execute("PRAGMA journal_mode = WAL")
        try execute("PRAGMA synchronous = \(synchronous)")
        try execute("PRAGMA foreign_keys = ON")
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(handle)
    }

    func execute(_ sql: String) throws {
        guard sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK else { throw failure(sql) }
    }

    enum Value {
        case integer(Int64)
        case text(String)
        case null
    }

    /// Runs a cached prepared statement; returns the first column of the first row, if any.
    @discardableResult
    func run(_ sql: String, _ values: [Value] = []) throws -> Int64? {
        var first: Int64?
        try forEachRow(sql, values) { row in
            if first == nil { first = row.int64(0) }
        }
        return first
    }

    /// A row of a statement being stepped, valid inside the ``forEachRow(_:_:_:)`` call that hands it.
    struct Row {
        fileprivate let statement: OpaquePointer

        func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }

        func text(_ column: Int32) -> Value {
            guard let bytes = sqlite3_column_text(statement, column) else { return .null }
            return .text(String(cString: bytes))
        }

        /// Reads every column as its stored type, text's bytes included, as a program that
        /// uses the row does, without copying them; returns how many bytes of text it read.
        @discardableResult
        func readAll() -> Int {
            var bytes = 0
            for column in 0..<sqlite3_column_count(statement) {
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: _ = sqlite3_column_int64(statement, column)
                case SQLITE_TEXT:
                    _ = sqlite3_column_text(statement, column)
                    bytes += Int(sqlite3_column_bytes(statement, column))
                default: break
                }
            }
            return bytes
        }
    }

    /// Runs a cached prepared statement and calls `row` with each row it returns.
    func forEachRow(_ sql: String, _ values: [Value] = [], _ row: (Row) throws -> Void) throws {
        let statement = try prepared(sql)
        defer { sqlite3_reset(statement) }
        for (index, value) in values.enumerated() {
            let position = Int32(index + 1)
            switch value {
            case .integer(let number): sqlite3_bind_int64(statement, position, number)
            case .text(let text): sqlite3_bind_text(statement, position, text, -1, Self.transient)
            case .null: sqlite3_bind_null(statement, position)
            }
        }
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { break }
            guard code == SQLITE_ROW else { throw failure(sql) }
            try row(Row(statement: statement))
        }
    }

    private func prepared(_ sql: String) throws -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
            let statement
        else { throw failure(sql) }
        statements[sql] = statement
        return statement
    }

    private func failure(_ sql: String) -> Failure {
        Failure(description: "\(sql): \(String(cString: sqlite3_errmsg(handle)))")
    }
}
