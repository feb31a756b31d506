/// How a hop ended.
public enum StepEnding: Sendable, Equatable {
    /// The step unhopped.
    case unhopped
    /// The step's deadline passed first (see ``FlowContext/hop(to:timeout:transition:)``).
    case timedOut
    /// A change of stored state ended the step (e.g. a logout ended a `main` step declared
    /// with `.external(unhopWhen: .sessionRemoved)`); the flow should take another path.
    case rerouted
}

/// The result of a hop: how the step ended, and the output it unhopped with.
public struct StepOutput: Sendable, Equatable {
    /// The output as JSON text; `nil` when the step unhopped without one, timed out or was re-routed.
    public let json: String?
    /// How the step ended.
    public let ending: StepEnding

    public init(json: String?, ending: StepEnding = .unhopped) {
        self.json = json
        self.ending = ending
    }

    /// Whether the step's deadline passed before it unhopped: take the flow's timeout branch.
    public var timedOut: Bool { ending == .timedOut }

    /// Whether a change of stored state ended the step: take the flow's other path.
    public var rerouted: Bool { ending == .rerouted }

    /// The output decoded as `T`; `nil` when there is none.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T? {
        guard let json else { return nil }
        return try JSONCoding.decode(type, from: json, what: "a step output")
    }
}
