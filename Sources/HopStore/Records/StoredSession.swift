#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

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

extension StoredSession {
    /// A session as another backend stored it.
    package static func stored(
        subject: String, userID: String, token: String, createdAt: Date, expiresAt: Date?
    ) -> StoredSession {
        StoredSession(subject: subject, userID: userID, token: token, createdAt: createdAt, expiresAt: expiresAt)
    }
}
