import Foundation

/// Checks that text handed to Hop as JSON (step outputs, decision values) is JSON.
public enum JSONText {
    /// - Throws: ``HopError`` of kind `.invalidInput` naming `what` when `text` does not parse.
    public static func validate(_ text: String, as what: String, path: String = "") throws {
        do {
            _ = try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
        } catch {
            throw HopError(
                .invalidInput, operation: "check \(what)", path: path,
                reason: "the \(what) is not valid JSON",
                hint: "Pass a JSON value, e.g. '{\"accepted\": true}', '\"text\"' or 'null'")
        }
    }
}
