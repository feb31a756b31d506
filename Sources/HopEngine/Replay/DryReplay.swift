import Foundation
import Synchronization

/// Replays a flow body against a recorded history without a database and without running a step:
/// how a test tells, before a deploy, whether new flow code can carry on the runs in flight.
///
/// The body runs until it asks for something the history does not hold yet (the point where a
/// live run would do new work: compatible), returns having matched the whole history
/// (compatible), or asks for something else than the history recorded (diverged, in the same
/// words as a divergence at run time, because the same ``Replay`` decides).
package enum DryReplay {
    /// What a dry replay found.
    package enum Verdict: Sendable, Equatable {
        /// The code asks for what the history recorded, as far as it goes.
        case compatible
        /// The code asks for something else at history entry `entry` (`nil`: past the end).
        case diverged(entry: Int64?, message: String)
        /// The flow body threw something else than a divergence.
        case failed(message: String)
    }

    /// Replays `flow`'s body against `history`, recorded by `run`.
    package static func replay(_ flow: Flow, run: RunRecord, history: [HistoryEntry]) async -> Verdict {
        let execution = DryExecution(run: run, codeVersion: flow.version, history: history)
        do {
            try await flow.body(FlowContext(executor: execution))
            try execution.finish()
            return .compatible
        } catch is DryExecution.Frontier {
            return .compatible
        } catch let error as HopError where error.code == .diverged {
            return .diverged(entry: execution.divergedAt, message: error.reason)
        } catch {
            return .failed(message: "\(error)")
        }
    }
}

/// A flow execution that only replays: every call the history does not hold yet ends the replay.
final class DryExecution: FlowExecution {
    /// The replay reached the end of the history: what a live run would do next is new work.
    struct Frontier: Error {}

    let run: RunRecord
    private let replay: Mutex<Replay>

    init(run: RunRecord, codeVersion: String, history: [HistoryEntry]) {
        self.run = run
        replay = Mutex(
            Replay(
                subject: Replay.Subject(
                    runID: run.id, flow: run.flow, subject: run.subject, startedVersion: run.flowVersion,
                    codeVersion: codeVersion),
                history: history))
    }

    var isReplaying: Bool { replay.withLock { $0.isReplaying } }

    /// The entry a divergence was found at.
    var divergedAt: Int64? { replay.withLock { $0.nextSeq } }

    func finish() throws { try replay.withLock { try $0.finish() } }

    func hop(
        to step: String, timeout: Duration?, transition: (@Sendable (Transition) async throws -> Void)?
    ) async throws -> StepOutput {
        guard case .ended(let output) = try replay.withLock({ try $0.consumeHop(to: step) }) else { throw Frontier() }
        return output
    }

    func sleep(for duration: Duration, name: String) async throws {
        guard try replay.withLock({ try $0.consume(.timer, name) }) != nil else { throw Frontier() }
    }

    func decide<T: Codable & Sendable>(_ name: String, _ read: @Sendable () async throws -> T) async throws -> T {
        guard let recorded = try replay.withLock({ try $0.consume(.decision, name) }) else { throw Frontier() }
        return try JSONCoding.decode(T.self, from: recorded.value ?? "null", what: "the recorded decision '\(name)'")
    }

    func isFirstUse(_ feature: String) async throws -> Bool {
        try await decide(Self.firstUseDecision(feature)) { () -> Bool in throw Frontier() }
    }

    func session() async throws -> SessionInfo? {
        try await decide(Self.sessionDecision) { () -> SessionInfo? in throw Frontier() }
    }

    func fact(_ key: String) async throws -> String? {
        try await decide(Self.factDecision(key)) { () -> String? in throw Frontier() }
    }

    func patched(_ name: String) async throws -> Bool {
        guard let taken = try replay.withLock({ try $0.consumePatch(name) }) else { throw Frontier() }
        return taken
    }

    func makeDurable() async throws {}

    func markUsed(_ feature: String) async throws {
        guard try replay.withLock({ try $0.consume(.effect, markUsedEffectName(feature)) }) != nil else {
            throw Frontier()
        }
    }
}
