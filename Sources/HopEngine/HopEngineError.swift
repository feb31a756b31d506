/// An error of the engine itself. Failures of the database arrive as `HopStoreError`.
public struct HopEngineError: Error, Sendable, CustomStringConvertible {
    /// What went wrong, for callers to match on.
    public enum Kind: Sendable, Equatable {
        /// No flow or step is registered under the name.
        case notRegistered
        /// The flow code asked for a different path than the run's history.
        case diverged
        /// A step threw on its last attempt; the run is failed.
        case stepFailed
        /// The run cannot do what was asked in its current state.
        case refused
        /// A value could not be encoded or decoded as JSON.
        case encoding
    }

    /// What went wrong.
    public var kind: Kind
    /// What is wrong and what to do, in sentences.
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    /// The message.
    public var description: String { message }
}

/// Why a flow body stopped early without failing: the engine's own control flow.
/// A flow body must let these errors pass (never catch and swallow what `hop` throws).
enum Suspension: Error {
    /// The run is parked on an external step; it resumes when the step is unhopped.
    case parked(step: String)
    /// The run was finished elsewhere (cancelled, restarted); it never advances again.
    case finished
}
