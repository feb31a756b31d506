/// The flows and steps registered with an engine, by name.
struct Registry: Sendable {
    struct StepRegistration: Sendable {
        enum Kind: Sendable {
            case inProcess(@Sendable () -> any HopStep)
            case external(ExternalStep)
        }
        var kind: Kind
        var retry: RetryPolicy
    }

    var flows: [String: Flow] = [:]
    var steps: [String: StepRegistration] = [:]
}
