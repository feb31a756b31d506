import Foundation

/// Writes hopctl's results: aligned tables for people, JSON for scripts.
enum Output {
    /// Prints `rows` under `headers` as columns separated by two spaces.
    static func table(_ headers: [String], _ rows: [[String]]) {
        let all = [headers] + rows.map { $0.map(printable) }
        var widths = [Int](repeating: 0, count: headers.count)
        for row in all {
            for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) }
        }
        var text = ""
        for row in all {
            let cells = row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }
            text += cells.joined(separator: "  ") + "\n"
        }
        line(text, terminator: "")
    }

    /// Prints `value` as pretty, key-sorted JSON.
    static func json(_ value: some Encodable) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        let text = String(decoding: try encoder.encode(value), as: UTF8.self)
        // Foundation pretty-prints an empty array with a blank line inside.
        line(text.filter { !$0.isWhitespace } == "[]" ? "[]" : text)
    }

    /// Prints one line of text for people.
    static func line(_ text: String, terminator: String = "\n") {
        FileHandle.standardOutput.write(Data((text + terminator).utf8))
    }

    /// `text` with control characters shown as escapes, so stored data cannot drive the terminal.
    static func printable(_ text: String) -> String {
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

    /// "12s ago", "5m ago", "3h ago", "2d ago"; "in 5m" for a future time.
    static func relative(_ date: Date, now: Date = Date()) -> String {
        let seconds = Int(max(-1e15, min(1e15, now.timeIntervalSince(date).rounded())))
        let magnitude = abs(seconds)
        let text: String
        switch magnitude {
        case ..<60: text = "\(magnitude)s"
        case ..<3600: text = "\(magnitude / 60)m"
        case ..<86_400: text = "\(magnitude / 3600)h"
        default: text = "\(magnitude / 86_400)d"
        }
        return seconds >= 0 ? "\(text) ago" : "in \(text)"
    }

    /// Prints a note to standard error.
    static func note(_ text: String) {
        FileHandle.standardError.write(Data((printable(text) + "\n").utf8))
    }
}
