#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// Writes hopctl's results: aligned tables for people, JSON for scripts.
enum Output {
    /// Prints `rows` under `headers` as columns separated by two spaces.
    static func table(_ headers: [String], _ rows: [[String]]) {
        line(tableText(headers, printableRows: rows.map { $0.map(printable) }), terminator: "")
    }

    /// The text ``table(_:_:)`` prints, of `rows` whose cells are already ``printable(_:)``.
    static func tableText(_ headers: [String], printableRows rows: [[String]]) -> String {
        var columns = Columns(headers)
        columns.widen(for: rows)
        return columns.text(of: [headers] + rows)
    }

    /// The widths of a table's columns, which ``table(_:_:)`` takes from every row it prints: a
    /// table too long to hold at once is printed a part at a time, once ``widen(for:)`` has seen
    /// every part.
    struct Columns {
        private var widths: [Int]

        /// The columns of `headers`, as wide as each header.
        init(_ headers: [String]) { widths = headers.map(\.count) }

        /// Widens the columns for `rows` (their cells already made ``Output/printable(_:)``).
        mutating func widen(for rows: [[String]]) {
            for row in rows {
                for (index, cell) in row.enumerated() where index < widths.count {
                    widths[index] = max(widths[index], cell.count)
                }
            }
        }

        /// `rows` as lines of the table: each cell but the last padded to its column's width.
        func text(of rows: [[String]]) -> String {
            var text = ""
            for row in rows {
                let cells = row.enumerated().map { index, cell in
                    let width = index < widths.count ? widths[index] : 0
                    return index == row.count - 1
                        ? cell : cell + String(repeating: " ", count: max(0, width - cell.count))
                }
                text += cells.joined(separator: "  ") + "\n"
            }
            return text
        }
    }

    /// Prints `value` as pretty, key-sorted JSON.
    static func json(_ value: some Encodable) throws {
        line(try jsonText(value))
    }

    /// `value` as pretty, key-sorted JSON.
    static func jsonText(_ value: some Encodable) throws -> String {
        let bytes = try jsonEncoder().encode(value)
        // Foundation pretty-prints an empty array with a blank line inside.
        let isEmptyArray = bytes.lazy.filter { !isJSONWhitespace($0) }.elementsEqual("[]".utf8)
        return isEmptyArray ? "[]" : String(decoding: bytes, as: UTF8.self)
    }

    /// The encoder of hopctl's JSON: pretty-printed, keys sorted, dates in ISO 8601.
    static func jsonEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }

    private static func isJSONWhitespace(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\n") || byte == UInt8(ascii: "\t")
            || byte == UInt8(ascii: "\r")
    }

    /// Prints a JSON array one element at a time, the same text as ``json(_:)`` prints for the
    /// whole array: a listing of any length in the memory of a few elements.
    struct JSONArray {
        private var elements = 0
        private var pending: [UInt8] = []
        private let encoder = Output.jsonEncoder()
        private let depth: Int
        private let write: (String) -> Void

        /// - Parameters:
        ///   - depth: how deep the array is: 0 for the whole text, 1 for the value of a key of the
        ///     object that is the whole text (written after the key by the caller; the array then
        ///     ends without a newline, and the caller goes on with the object). An empty array
        ///     is written `[]` at any depth.
        ///   - write: where the text goes (standard output unless a test says otherwise).
        init(depth: Int = 0, write: @escaping (String) -> Void = { Output.line($0, terminator: "") }) {
            self.depth = depth
            self.write = write
        }

        /// Adds `element` to the array.
        mutating func append(_ element: some Encodable) throws {
            let bytes = try encoder.encode(element)
            pending.append(contentsOf: (elements == 0 ? "[\n" : ",\n").utf8)
            // One level deeper than the array: each line but an empty one indented by two spaces
            // a level.
            let newline = UInt8(ascii: "\n")
            let space = UInt8(ascii: " ")
            bytes.withUnsafeBytes { text in
                var lineStarts = true
                for byte in text {
                    if lineStarts && byte != newline {
                        for _ in 0..<elementIndent { pending.append(space) }
                    }
                    pending.append(byte)
                    lineStarts = byte == newline
                }
            }
            elements += 1
            if pending.count >= 1 << 16 { flush() }
        }

        /// Adds an element that `body` writes itself, a part at a time (the history of a long run):
        /// the text ``append(_:)`` would write for it, its lines but the first (which follows
        /// the array's own text) indented for one level deeper than the array, no newline after it.
        mutating func appendWritten(_ body: (@escaping (String) -> Void) async throws -> Void) async throws {
            pending.append(contentsOf: (elements == 0 ? "[\n" : ",\n").utf8)
            pending.append(contentsOf: String(repeating: " ", count: elementIndent).utf8)
            flush()
            try await body(write)
            elements += 1
        }

        /// How many spaces an element's lines are indented by: one level deeper than the array.
        private var elementIndent: Int { 2 * (depth + 1) }

        /// Closes the array and writes what is left.
        mutating func finish() {
            let close = String(repeating: " ", count: 2 * depth) + "]"
            let end = depth == 0 ? "\n" : ""
            pending.append(contentsOf: (elements == 0 ? "[]\(end)" : "\n\(close)\(end)").utf8)
            flush()
        }

        private mutating func flush() {
            write(String(decoding: pending, as: UTF8.self))
            pending.removeAll(keepingCapacity: true)
        }
    }

    /// Prints one line of text for people.
    static func line(_ text: String, terminator: String = "\n") {
        StandardStream.write(text + terminator, to: STDOUT_FILENO)
    }

    /// `text` with control characters shown as escapes, so stored data cannot drive the terminal.
    static func printable(_ text: String) -> String {
        // Most text is printable ASCII: kept as it is without a look at each character's category.
        if text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return text }
        var result = ""
        for scalar in text.unicodeScalars {
            if scalar.properties.generalCategory == .control {
                result += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    /// `text` cut to `limit` characters, with "…" where it was cut: long outputs stay on one line.
    static func abbreviated(_ text: String, _ limit: Int = 60) -> String {
        text.count <= limit ? text : String(text.prefix(limit - 1)) + "…"
    }

    /// "12s ago", "5m30s ago", "3h ago", "1d12h ago"; "in 1h30m" for a future time. The two
    /// largest units, the second left out when it is zero: a time reads at most a unit of its
    /// second place short (an expiry of 90 minutes is "in 1h30m", not "in 1h").
    static func relative(_ date: Date, now: Date) -> String {
        let seconds = Int(max(-1e15, min(1e15, now.timeIntervalSince(date).rounded())))
        let magnitude = abs(seconds)
        let units = [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")]
        var text = "\(magnitude)s"
        if let first = units.firstIndex(where: { magnitude >= $0.0 }) {
            let (size, name) = units[first]
            text = "\(magnitude / size)\(name)"
            if first + 1 < units.count {
                let (smaller, smallerName) = units[first + 1]
                let rest = magnitude % size / smaller
                if rest > 0 { text += "\(rest)\(smallerName)" }
            }
        }
        return seconds >= 0 ? "\(text) ago" : "in \(text)"
    }

    /// Prints a note to standard error.
    static func note(_ text: String) {
        StandardStream.write(printable(text) + "\n", to: STDERR_FILENO)
    }
}

/// Standard output, error and input, written and read with the system's calls: hopctl does not
/// load Foundation (its start is most of a command's time).
enum StandardStream {
    /// Writes all of `text` to `descriptor`, retrying interrupted and partial writes.
    static func write(_ text: String, to descriptor: Int32) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                return  // a closed pipe: nothing more can be said
            }
            bytes = bytes.dropFirst(written)
        }
    }

    /// Everything on standard input until it closes, at most `limit` bytes (then `nil`).
    static func readInput(limit: Int) -> [UInt8]? {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(STDIN_FILENO, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return bytes
            }
            if count == 0 { return bytes }
            bytes += buffer[..<count]
            if bytes.count > limit { return nil }
        }
    }
}
