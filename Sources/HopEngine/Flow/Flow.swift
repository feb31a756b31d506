/// A flow: the one place that owns a whole conditional sequence of hops.
///
/// The body runs from the top every time its run is executed — at start, after a crash,
/// after an external unhop. Everything it asks of its ``FlowContext`` is recorded the first
/// time and replayed afterwards, so the body must reach its hops only through `FlowContext`
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
    let body: @Sendable (FlowContext) async throws -> Void

    public init(
        _ name: String, version: String, transition: (@Sendable (Transition) async throws -> Void)? = nil,
        _ body: @escaping @Sendable (FlowContext) async throws -> Void
    ) {
        self.name = name
        self.version = version
        self.transition = transition
        self.body = body
    }
}
