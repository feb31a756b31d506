import Foundation

/// A feature a subject has used; a feature without a flag is on its first use.
public struct FirstUseFlag: Sendable, Equatable, Codable {
    /// The feature's name, e.g. "onboarding".
    public var feature: String
    /// When it was first used (since its last reset).
    public var usedAt: Date
}

/// A stored user session. Its `description` never shows the token.
public struct StoredSession: Sendable, Equatable, Codable, CustomStringConvertible, CustomDebugStringConvertible {
    /// Whom the session is for.
    public var subject: String
    /// The user logged in.
    public var userID: String
    /// The secret the daemon needs back. Never logged or printed by Hop unless asked to.
    public var token: String
    /// When the session was stored.
    public var createdAt: Date
    /// When the session stops counting as stored; `nil` for never.
    public var expiresAt: Date?

    /// The session with its token redacted.
    public var description: String {
        "session of \(userID) for \(subject) (token \(StoredSession.redact(token)))"
    }

    /// The session with its token redacted.
    public var debugDescription: String { description }

    /// The longest token a session may hold, in bytes of UTF-8.
    public static let maximumTokenBytes = 4096

    /// `token` shortened to a recognisable, non-secret form: its first 4 characters, then asterisks.
    public static func redact(_ token: String) -> String {
        token.count <= 8 ? "********" : String(token.prefix(4)) + "…" + "********"
    }
}

/// One of the daemon's own key/value facts about a subject.
public struct Fact: Sendable, Equatable, Codable {
    /// The fact's name, e.g. "terms-version".
    public var key: String
    /// The fact's value.
    public var value: String
    /// When it was last set.
    public var updatedAt: Date
}

/// An edge of the hop graph of a flow: how many times runs went from one step to the next.
public struct HopEdge: Sendable, Equatable, Codable {
    /// `nil` for the start of a run.
    public var from: String?
    /// The step entered.
    public var to: String
    /// How many times runs took this edge.
    public var count: Int
}
