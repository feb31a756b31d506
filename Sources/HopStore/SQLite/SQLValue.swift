/// A value bound to a statement parameter or read from a column.
enum SQLValue: Sendable, Equatable {
    case null
    case integer(Int64)
    case text(String)

    static func optional(_ text: String?) -> SQLValue { text.map(SQLValue.text) ?? .null }
    static func optional(_ integer: Int64?) -> SQLValue { integer.map(SQLValue.integer) ?? .null }
}

extension SQLValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByNilLiteral {
    init(stringLiteral value: String) { self = .text(value) }
    init(integerLiteral value: Int64) { self = .integer(value) }
    init(nilLiteral: ()) { self = .null }
}
