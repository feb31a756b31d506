import Foundation

/// What a flow knows about a stored session, as recorded in history: never the token.
public struct SessionInfo: Sendable, Codable, Equatable {
    /// The user the session belongs to.
    public var userID: String
    /// When the session was stored.
    public var createdAt: Date
    /// When it stops counting as stored; `nil` for never.
    public var expiresAt: Date?
}
