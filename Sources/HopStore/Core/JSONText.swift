#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Checks that text handed to Hop as JSON (step outputs, decision values) is JSON.
public enum JSONText {
    /// - Throws: ``HopError`` of kind `.invalidInput` naming `what` when `text` does not parse.
    public static func validate(_ text: String, as what: String, path: String = "") throws {
        // The values most decisions hold need no parser.
        if text == "true" || text == "false" || text == "null" { return }
        do {
            _ = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
        } catch {
            throw HopError(
                .invalidInput, operation: "check \(what)", path: path,
                reason: "the \(what) is not valid JSON",
                hint: "Pass a JSON value, e.g. '{\"accepted\": true}', '\"text\"' or 'null'")
        }
    }
}

/// Any JSON value: what `JSONText.validate` decodes to check text, and what hopctl prints a
/// stored value as (the JSON it holds, or the text itself as a JSON string).
package enum JSONValue: Codable, Sendable, Equatable {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// The JSON `text` holds, or `text` itself as a JSON string when it is not JSON.
    package init(stored text: String) {
        self = (try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))) ?? .string(text)
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .integer(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }
}
