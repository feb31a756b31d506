import Foundation

/// What carries out the calls of a flow body (``FlowContext`` describes them; this does them):
/// a run's executor in an engine, or a dry replay of a recorded history in a test.
protocol FlowExecution: Sendable {
    /// The run the body executes for.
    var run: RunRecord { get }
    var isReplaying: Bool { get }

    func hop(
        to step: String, timeout: Duration?, transition: (@Sendable (Transition) async throws -> Void)?
    ) async throws -> StepOutput
    func sleep(for duration: Duration, name: String) async throws
    func decide<T: Codable & Sendable>(_ name: String, _ read: @Sendable () async throws -> T) async throws -> T
    func isFirstUse(_ feature: String) async throws -> Bool
    func session() async throws -> SessionInfo?
    func fact(_ key: String) async throws -> String?
    func patched(_ name: String) async throws -> Bool
    func markUsed(_ feature: String) async throws
    func makeDurable() async throws
}

extension FlowExecution {
    /// The names under which the subject reads are recorded as decisions.
    static func firstUseDecision(_ feature: String) -> String { "isFirstUse(\(feature))" }
    static var sessionDecision: String { "session" }
    static func factDecision(_ key: String) -> String { "fact(\(key))" }
}
