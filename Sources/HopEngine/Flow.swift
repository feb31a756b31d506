/// A flow: the one place that owns a whole conditional sequence of hops.
///
/// The body runs from the top every time its run is executed — at start, after a crash,
/// after an external unhop. Everything it asks of its ``FlowRun`` is recorded the first
/// time and replayed afterwards, so the body must reach its hops only through `FlowRun`
/// (keep other side effects in steps) and must not catch and swallow errors that `hop` throws.
///
/// ```swift
/// let startup = Flow("startup", version: "1") { flow in
///     try await flow.hop(to: "splash")
///     if try await flow.isFirstUse("onboarding") {
///         try await flow.hop(to: "onboarding")
///         try await flow.markUsed("onboarding")
///     }
///     if try await flow.session() == nil {
///         try await flow.hop(to: "login")
///     }
///     try await flow.hop(to: "main")
/// }
/// ```
public struct Flow: Sendable {
    /// The flow's name, as runs and `hopctl --flow` know it.
    public let name: String
    /// The flow code's version, recorded with each run and named when a run diverges.
    public let version: String
    /// Runs around every hop of the flow before the hop counts as entered (see ``Transition``).
    public let transition: (@Sendable (Transition) async throws -> Void)?
    let body: @Sendable (FlowRun) async throws -> Void

    public init(
        _ name: String, version: String, transition: (@Sendable (Transition) async throws -> Void)? = nil,
        _ body: @escaping @Sendable (FlowRun) async throws -> Void
    ) {
        self.name = name
        self.version = version
        self.transition = transition
        self.body = body
    }
}

/// A hop about to happen: CLHoppingViewController's custom transition block (from, to, completion).
/// The hop is recorded as entered only once the transition hook returns.
public struct Transition: Sendable {
    /// The flow name.
    public let flow: String
    /// Whom the run is for.
    public let subject: String
    /// The run id.
    public let runID: Int64
    /// The step the run last entered, `nil` at the start of the run.
    public let from: String?
    /// The step about to be entered.
    public let to: String
}

/// What a flow knows about a stored session, as recorded in history: never the token.
public struct SessionInfo: Sendable, Codable, Equatable {
    /// The user the session belongs to.
    public var userID: String
    /// When the session was stored.
    public var createdAt: Date
    /// When it stops counting as stored; `nil` for never.
    public var expiresAt: Date?
}

import Foundation
