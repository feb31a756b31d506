internal import CSQLite

/// A prepared statement, owned by one ``Connection`` and reused through its cache.
final class Statement {
    let handle: OpaquePointer
    let sql: String

    init(handle: OpaquePointer, sql: String) {
        self.handle = handle
        self.sql = sql
    }

    deinit { sqlite3_finalize(handle) }

    /// Binds `values` to the parameters ?1, ?2, … in order.
    func bind(_ values: [SQLValue]) -> Int32 {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        for (offset, value) in values.enumerated() {
            let index = Int32(offset + 1)
            let code: Int32
            switch value {
            case .null:
                code = sqlite3_bind_null(handle, index)
            case .integer(let integer):
                code = sqlite3_bind_int64(handle, index, integer)
            case .text(let text):
                var text = text
                code = text.withUTF8 { bytes in
                    guard let base = bytes.baseAddress else {
                        return sqlite3_bind_text(handle, index, "", 0, sqliteTransient)
                    }
                    return sqlite3_bind_text64(
                        handle, index, UnsafeRawPointer(base).assumingMemoryBound(to: CChar.self),
                        sqlite3_uint64(bytes.count), sqliteTransient, UInt8(SQLITE_UTF8))
                }
            }
            if code != SQLITE_OK { return code }
        }
        return SQLITE_OK
    }
}

/// Tells SQLite to copy a bound value (the SQLITE_TRANSIENT macro, which Swift cannot import).
nonisolated(unsafe) let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

/// The current row of a stepping statement.
struct Row {
    let handle: OpaquePointer

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    func optionalInt64(_ column: Int32) -> Int64? { isNull(column) ? nil : int64(column) }

    func text(_ column: Int32) -> String { optionalText(column) ?? "" }

    func optionalText(_ column: Int32) -> String? {
        guard let bytes = sqlite3_column_text(handle, column) else { return nil }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }
}
