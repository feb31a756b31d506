#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The rules for names Hop stores: flows, subjects, steps, features, fact keys, user ids.
public enum Identifier {
    /// The longest identifier accepted, in UTF-8 bytes.
    public static let maximumLength = 256

    /// Checks that `value` is 1…256 UTF-8 bytes of visible text: letters, digits, punctuation,
    /// symbols and spaces of any script, but no control or format characters (U+202E right-to-left
    /// override, U+200B zero-width space…) nor line or paragraph separators, which would let one
    /// name pose as another in a table.
    /// - Throws: ``HopError`` of kind `.invalidInput`, naming `what` and the rule.
    public static func validate(_ value: String, as what: String, path: String = "") throws {
        let bytes = value.utf8.count
        var problem: String?
        if bytes == 0 {
            problem = "it is empty"
        } else if bytes > maximumLength {
            problem = "it is \(bytes) bytes long; the limit is \(maximumLength)"
        } else if let scalar = Self.firstInvisible(in: value) {
            let hex = String(scalar.value, radix: 16, uppercase: true)
            let code = "U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
            problem =
                "it contains \(code), \(scalar.properties.generalCategory == .control ? "a control" : "an invisible formatting") character"
        }
        if let problem {
            throw HopError(
                .invalidInput, operation: "check \(what)", path: path,
                reason: "the \(what) is not a valid identifier: \(problem)",
                hint: "Use 1 to \(maximumLength) bytes of printable text")
        }
    }

    /// The first scalar of `value` an identifier may not hold. The zero-width joiner and non-joiner
    /// are part of some scripts (Persian, Indic) and of emoji sequences: allowed inside a name.
    private static func firstInvisible(in value: String) -> Unicode.Scalar? {
        // Most names are printable ASCII: nothing to look up.
        if value.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return nil }
        let scalars = Array(value.unicodeScalars)
        for (index, scalar) in scalars.enumerated() where invisible.contains(scalar.properties.generalCategory) {
            let joiner = scalar.value == 0x200C || scalar.value == 0x200D
            if joiner, index > 0, index < scalars.count - 1 { continue }
            return scalar
        }
        return nil
    }

    /// The general categories an identifier may not hold.
    private static let invisible: Set<Unicode.GeneralCategory> = [
        .control, .format, .lineSeparator, .paragraphSeparator,
    ]
}
