import Foundation
import Synchronization

/// What a step sees of its run (CLHoppingViewController's `hoppingViewController` accessor): who
/// it runs for, ``unhop()``, and its subject's stored state.
///
/// It gives a step what a step needs, not the engine's write API: a step cannot record hops,
/// complete runs or claim them.
public struct StepContext: Sendable {
    /// The flow name.
    public let flow: String
    /// Whom the run is for.
    public let subject: String
    /// The run id.
    public let runID: Int64
    /// This step's name.
    public let step: String
    /// The hop's token; an unhop must present it.
    public let token: String
    /// 1 for the first try of this hop in this process, 2 for a retry, …
    public let attempt: Int
    /// Whether the step was in flight when its run was interrupted and is entered again.
    public let isReentry: Bool
    let storage: any HopStorage
    let unhop: StepUnhop

    /// Reports that the step finished, with no output.
    ///
    /// The unhop is seen by the engine at once and durable with the run's next hop, or a few
    /// milliseconds later: a crash before that runs the step again (at least once). Call
    /// ``makeDurable()`` after it before the step does something that must not be repeated.
    public func unhop() async throws {
        try await unhop.unhop(output: nil)
    }

    /// Reports that the step finished, with `output` (stored as JSON in the history and
    /// returned by the flow's ``FlowContext/hop(to:timeout:transition:)``).
    public func unhop(output: some Encodable & Sendable) async throws {
        try await unhop.unhop(output: try JSONCoding.encode(output))
    }

    /// Makes the run's records so far — this step's unhop among them — durable now.
    public func makeDurable() async throws {
        try await storage.makeDurable()
    }

    // MARK: The subject's stored state

    /// Whether the subject has never used `feature` (or it was reset).
    public func isFirstUse(_ feature: String) async throws -> Bool {
        try await storage.isFirstUse(subject: subject, feature: feature)
    }

    /// The subject's stored, unexpired session, with its token (never log it).
    public func session() async throws -> StoredSession? {
        try await storage.session(subject: subject)
    }

    /// Stores the subject's session (a login step that signs the user in itself). Steps of other
    /// runs of the subject that wait for a login are unhopped in the same transaction.
    public func storeSession(userID: String, token: String, expiresAt: Date? = nil) async throws {
        try await storage.storeSession(subject: subject, userID: userID, token: token, expiresAt: expiresAt)
    }

    /// The daemon's fact `key` about the subject.
    public func fact(_ key: String) async throws -> String? {
        try await storage.fact(subject: subject, key: key)
    }

    /// Stores the daemon's fact `key` = `value` about the subject.
    public func setFact(_ key: String, _ value: String) async throws {
        try await storage.setFact(subject: subject, key: key, value: value)
    }
}

/// Records the unhop of one in-process hop, through the run's executor, and remembers that it happened.
final class StepUnhop: Sendable {
    private struct State {
        var unhopped = false
        var output: String?
        /// The step is unhopping itself (its unhop is being written).
        var writing = false
        /// The step returned without unhopping: its executor holds the unhop.
        var held = false
    }

    private let executor: RunExecutor
    private let step: String
    private let token: String
    private let state = Mutex(State())

    init(executor: RunExecutor, step: String, token: String) {
        self.executor = executor
        self.step = step
        self.token = token
    }

    func unhop(output: String?) async throws {
        let ended = state.withLock { state in
            if state.held { return true }
            state.writing = true
            return false
        }
        if ended {
            // The unhop is not written yet, so the store would take this one: refused here.
            throw HopError(
                .refused,
                "step '\(step)' of run \(executor.run.id) already ended: it returned, and its unhop is recorded with the run's next record; a step unhops at most once, before it returns"
            )
        }
        defer { state.withLock { $0.writing = false } }
        try await executor.record(.unhop(token: token, output: output), step: step, durability: .coalesced)
        executor.environment.metrics.unhops.increment()
        state.withLock {
            $0.unhopped = true
            $0.output = output
        }
    }

    /// Marks the step ended without output, for its executor to hold the unhop; `false` when
    /// the step unhopped, or is unhopping, itself.
    func hold() -> Bool {
        state.withLock { state in
            guard !state.unhopped, !state.writing else { return false }
            state.unhopped = true
            state.held = true
            return true
        }
    }

    var result: (unhopped: Bool, output: String?) { state.withLock { ($0.unhopped, $0.output) } }
}
