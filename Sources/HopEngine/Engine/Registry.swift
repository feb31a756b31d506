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

    /// The versions of each flow, in registration order: the last one is the newest.
    var flows: [String: [Flow]] = [:]
    var steps: [String: StepRegistration] = [:]

    /// Registers `flow`, replacing a flow of the same name and version in place (it keeps its
    /// rank), else as the newest version of its name.
    mutating func register(_ flow: Flow) {
        if let index = flows[flow.name]?.firstIndex(where: { $0.version == flow.version }) {
            flows[flow.name]?[index] = flow
        } else {
            flows[flow.name, default: []].append(flow)
        }
    }

    /// Version `version` of flow `name`, or its newest version when `version` is `nil`.
    func flow(named name: String, version: String? = nil) -> Flow? {
        guard let version else { return flows[name]?.last }
        return flows[name]?.first { $0.version == version }
    }

    /// The registered versions of each flow, in registration order.
    var versions: [String: [String]] { flows.mapValues { $0.map(\.version) } }
}
