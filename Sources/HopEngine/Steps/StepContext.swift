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
    /// The engine takes the unhop at once, in memory, and writes it with the run's next record
    /// (its next hop, decision, effect, timer or completion) in one write, or alone a few
    /// milliseconds later if the step goes on running; it is durable with the run's next hop or
    /// a few milliseconds after that. A crash before then runs the step again (at least once).
    /// Call ``makeDurable()`` after it before the step does something that must not be repeated.
    ///
    /// A step unhops at most once: a second unhop, or one after the step returned, timed out or
    /// failed, throws `HopError.Code.refused`. If the step was ended from outside meanwhile
    /// (`engine.unhop` with its token), or its run cancelled, the unhop is refused when it is
    /// written: the run goes on from its history (or stays cancelled), and ``makeDurable()``
    /// throws the refusal.
    public func unhop() async throws {
        try unhop.unhop(output: nil)
    }

    /// Reports that the step finished, with `output` (stored as JSON in the history and
    /// returned by the flow's ``FlowContext/hop(to:timeout:transition:)``). Written and durable
    /// as ``unhop()`` is.
    public func unhop(output: some Encodable & Sendable) async throws {
        try unhop.unhop(output: try JSONCoding.encode(output))
    }

    /// Makes the run's records so far — this step's unhop among them — durable now. Throws
    /// `HopError.Code.refused` when this step's unhop was refused as it was written (the step
    /// was ended from outside, or its run cancelled, before).
    public func makeDurable() async throws {
        try await unhop.makeDurable()
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

    /// The time by the database's clock (see ``HopEngine/now()``): compute a session's
    /// `expiresAt` from it.
    public func now() -> Date { storage.now() }

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

/// The end of one attempt at an in-process step: the step's own unhop, or its return, taken in
/// memory and handed to the run's executor, which writes it with the run's next record
/// (`HeldUnhops.swift`); or its timeout or failure, after which an unhop is refused.
final class StepUnhop: Sendable {
    private enum Phase {
        case running
        /// Unhopped by the step, or by returning: held by the executor, or written.
        case unhopped
        /// Timed out or failed: the executor records that instead.
        case ended
    }

    private struct State {
        var phase = Phase.running
        var output: String?
        /// Why the unhop's write failed (a refusal when the step was ended from outside).
        var writeError: (any Error)?
    }

    let step: String
    let token: String
    private let executor: RunExecutor
    private let state = Mutex(State())

    init(executor: RunExecutor, step: String, token: String) {
        self.executor = executor
        self.step = step
        self.token = token
    }

    /// The step's own unhop: taken at once, written by the executor with the run's next record.
    func unhop(output: String?) throws {
        let phase = state.withLock { state in
            let phase = state.phase
            if phase == .running {
                state.phase = .unhopped
                state.output = output
            }
            return phase
        }
        switch phase {
        case .running:
            executor.holdUnhop(self)
        case .unhopped:
            throw HopError(
                .refused,
                "step '\(step)' of run \(executor.run.id) already ended: it unhopped or returned, and its unhop is recorded with the run's next record; a step unhops at most once, before it returns"
            )
        case .ended:
            throw HopError(
                .refused,
                "step '\(step)' of run \(executor.run.id) already ended: it timed out or failed, and the run records that instead; a step unhops at most once, before it returns"
            )
        }
    }

    /// The step's body returned: unhopped without output, unless it unhopped itself.
    func returned() {
        let unhops = state.withLock { state in
            guard state.phase == .running else { return false }
            state.phase = .unhopped
            return true
        }
        if unhops { executor.holdUnhop(self) }
    }

    /// The step timed out or threw: a later unhop is refused. Returns whether it had unhopped
    /// first (then its unhop stands).
    func end() -> Bool {
        state.withLock { state in
            if state.phase == .running { state.phase = .ended }
            return state.phase == .unhopped
        }
    }

    /// The output the step unhopped with.
    var output: String? { state.withLock { $0.output } }

    /// Notes that the executor could not write the unhop (`error`).
    func writeFailed(_ error: any Error) {
        state.withLock { $0.writeError = error }
    }

    /// Writes the unhop if the executor still holds it and commits (the executor's
    /// `RunExecutor.makeDurable()`), then throws why the unhop could not be written, if it could not.
    func makeDurable() async throws {
        do {
            try await executor.makeDurable()
        } catch {
            // Said in the step's terms when its own unhop's write is what failed.
            throw state.withLock({ $0.writeError }) ?? error
        }
        if let error = state.withLock({ $0.writeError }) { throw error }
    }
}
