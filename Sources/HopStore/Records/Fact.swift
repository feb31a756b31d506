#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One of the daemon's own key/value facts about a subject.
public struct Fact: Sendable, Equatable, Codable {
    /// The fact's name, e.g. "terms-version".
    public var key: String
    /// The fact's value.
    public var value: String
    /// When it was last set.
    public var updatedAt: Date
}

extension Fact {
    /// A fact as read from a database.
    package static func stored(key: String, value: String, updatedAt: Date) -> Fact {
        Fact(key: key, value: value, updatedAt: updatedAt)
    }
}
