/// The rules for names Hop stores: flows, subjects, steps, features, fact keys, user ids.
public enum Identifier {
    /// The longest identifier accepted, in UTF-8 bytes.
    public static let maximumLength = 256

    /// Checks that `value` is 1…256 UTF-8 bytes with no control characters.
    /// - Throws: ``HopStoreError`` of kind `.invalidInput`, naming `what` and the rule.
    public static func validate(_ value: String, as what: String, path: String = "") throws {
        let bytes = value.utf8.count
        var problem: String?
        if bytes == 0 {
            problem = "it is empty"
        } else if bytes > maximumLength {
            problem = "it is \(bytes) bytes long; the limit is \(maximumLength)"
        } else if value.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            problem = "it contains a control character"
        }
        if let problem {
            throw HopStoreError(
                .invalidInput, operation: "check \(what)", path: path,
                reason: "the \(what) is not a valid identifier: \(problem)",
                hint: "Use 1 to \(maximumLength) bytes of printable text")
        }
    }
}
