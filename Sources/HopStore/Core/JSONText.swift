#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Checks that text handed to Hop as JSON (step outputs, decision values) is JSON.
public enum JSONText {
    /// - Throws: ``HopError`` of kind `.invalidInput` naming `what` when `text` does not parse.
    public static func validate(_ text: String, as what: String, path: String = "") throws {
        do {
            _ = try JSONDecoder().decode(AnyJSON.self, from: Data(text.utf8))
        } catch {
            throw HopError(
                .invalidInput, operation: "check \(what)", path: path,
                reason: "the \(what) is not valid JSON",
                hint: "Pass a JSON value, e.g. '{\"accepted\": true}', '\"text\"' or 'null'")
        }
    }
}

/// Any JSON value, decoded only to check that text is JSON (the decoder bounds the nesting depth).
private struct AnyJSON: Decodable {
    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { return }
        if (try? container.decode(Bool.self)) != nil { return }
        if (try? container.decode(Double.self)) != nil { return }
        if (try? container.decode(String.self)) != nil { return }
        if (try? container.decode([AnyJSON].self)) != nil { return }
        _ = try container.decode([String: AnyJSON].self)
    }
}
