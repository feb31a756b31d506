#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A feature a subject has used; a feature without a flag is on its first use.
public struct FirstUseFlag: Sendable, Equatable, Codable {
    /// The feature's name, e.g. "onboarding".
    public var feature: String
    /// When it was first used (since its last reset).
    public var usedAt: Date
}

extension FirstUseFlag {
    /// A flag as read from a database.
    package static func stored(feature: String, usedAt: Date) -> FirstUseFlag {
        FirstUseFlag(feature: feature, usedAt: usedAt)
    }
}
