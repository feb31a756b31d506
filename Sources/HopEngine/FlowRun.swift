import Foundation
import HopStore
import Synchronization

/// A flow body's handle on its run: hop to steps, read conditions, change stored state.
///
/// Each call is committed to the run's history before it returns; when the run is executed
/// again (after a crash or an external unhop), calls already in the history return their
/// recorded result without doing their work again.
public final class FlowRun: Sendable {
    /// The flow name.
    public let flow: String
    /// Whom the run is for.
    public let subject: String
    /// The run id, as `hopctl status` shows it.
    public let runID: Int64
    /// The flow version the run was started with.
    public let startedVersion: String

    private let definition: Flow
    private let engine: HopEngine
    private let store: HopStore
    private let state: Mutex<ReplayState>

    struct ReplayState {
        var history: [HistoryEvent]
        var position = 0
        var lastStep: String?
        var stopped: Error?

        var next: HistoryEvent? { position < history.count ? history[position] : nil }

        /// Moves past the next entry; once the whole history is replayed, lets it go (a run
        /// may then wait in a step for a long time, and thousands may).
        mutating func advance() {
            position += 1
            if position >= history.count {
                history = []
                position = 0
            }
        }
    }

    init(run: RunRecord, definition: Flow, history: [HistoryEvent], engine: HopEngine, store: HopStore) {
        flow = run.flow
        subject = run.subject
        runID = run.id
        startedVersion = run.flowVersion
        self.definition = definition
        self.engine = engine
        self.store = store
        let replayed = history.allSatisfy(\.kind.isReplayed) ? history : history.filter(\.kind.isReplayed)
        state = Mutex(ReplayState(history: replayed))
    }

    /// Whether the run is still replaying its history (the calls return recorded results).
    public var isReplaying: Bool { state.withLock { $0.next != nil } }

    // MARK: Hops

    /// Hops to `step` and returns when it unhops, with its output: the code after this call is the `then`.
    ///
    /// The hop is committed before the step runs; a step already unhopped in the history is
    /// not run again. A step that was in flight when the run was interrupted runs again.
    /// An external step parks the run: the body stops here and continues, from the top with
    /// replay, once the step is unhopped.
    ///
    /// - Parameters:
    ///   - timeout: how long the step may take. The deadline is stored with the hop, so it holds
    ///     across restarts; when it passes first, the step is ended (an in-process step's task is
    ///     cancelled) and the result's ``StepOutput/timedOut`` is `true`: take the timeout branch.
    ///   - transition: runs before the hop is recorded, instead of the flow's transition.
    @discardableResult
    public func hop(
        to step: String, timeout: Duration? = nil, transition: (@Sendable (Transition) async throws -> Void)? = nil
    ) async throws -> StepOutput {
        // Kept lean: this frame stays allocated while the step runs (see HopEngine.perform).
        switch try replayHop(to: step) {
        case .ended(let output):
            return output
        case .inFlight(let token, let deadline):
            // In flight when the run stopped: enter it again, with the deadline it had.
            return try await engine.enter(step: step, token: token, deadline: deadline, run: self, isReentry: true)
        case .new:
            let (token, deadline) = try await recordHop(to: step, timeout: timeout, transition: transition)
            return try await engine.enter(step: step, token: token, deadline: deadline, run: self, isReentry: false)
        }
    }

    private enum ReplayedHop {
        /// The history holds the hop and its end: the step is not entered again.
        case ended(StepOutput)
        /// The history holds the hop only: the step was in flight.
        case inFlight(token: String, deadline: Date?)
        /// Past the end of the history: a new hop.
        case new
    }

    @inline(never)
    private func replayHop(to step: String) throws -> ReplayedHop {
        try state.withLock { state -> ReplayedHop in
            try checkNotStopped(state)
            guard let event = state.next else { return .new }
            guard event.kind == .hop, event.step == step else {
                throw diverged(state, asked: "hop to '\(step)'")
            }
            state.advance()
            state.lastStep = step
            guard let after = state.next, after.kind.endsStep else {
                return .inFlight(token: event.token ?? "", deadline: Self.deadline(of: event))
            }
            guard after.token == event.token else { throw diverged(state, asked: "the end of '\(step)'") }
            state.advance()
            return .ended(Self.output(of: after))
        }
    }

    /// Runs the transition hook, then records a new hop to `step`; returns its token and deadline.
    @inline(never)
    private func recordHop(
        to step: String, timeout: Duration?, transition: (@Sendable (Transition) async throws -> Void)?
    ) async throws -> (token: String, deadline: Date?) {
        let from = state.withLock { $0.lastStep }
        let hook = transition ?? definition.transition
        if let hook {
            try await hook(Transition(flow: flow, subject: subject, runID: runID, from: from, to: step))
        }
        let deadline = timeout.map { Date().addingTimeInterval(Self.seconds($0)) }
        let event = try await engine.recordHop(run: self, step: step, from: hook == nil ? nil : from, deadline: deadline)
        state.withLock { $0.lastStep = step }
        return (event.token ?? "", deadline)
    }

    private static func output(of end: HistoryEvent) -> StepOutput {
        switch end.kind {
        case .timeout: StepOutput(json: nil, ending: .timedOut)
        case .reroute: StepOutput(json: nil, ending: .rerouted)
        default: StepOutput(json: end.value)
        }
    }

    private static func deadline(of hop: HistoryEvent) -> Date? {
        struct Stored: Decodable { var deadline: Int64 }
        guard let value = hop.value, let stored = try? JSONDecoder().decode(Stored.self, from: Data(value.utf8)) else { return nil }
        return Date(timeIntervalSince1970: Double(stored.deadline) / 1000)
    }

    /// `seconds` as a duration to sleep, at most about 300 years: a deadline read from the
    /// database never traps, however far ahead it lies.
    static func sleepDuration(seconds: TimeInterval) -> Duration {
        .milliseconds(Int64(max(0, min(seconds, 1e10)) * 1000))
    }

    private static func seconds(_ duration: Duration) -> TimeInterval {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    // MARK: Timers

    /// Sleeps durably: the deadline is recorded, so a run resumed after a restart wakes at the
    /// original deadline, not a fresh one (at once when it has passed).
    ///
    /// - Parameter name: unique within the run's path when a flow sleeps more than once.
    public func sleep(for duration: Duration, name: String = "sleep") async throws {
        let recorded = try state.withLock { state -> HistoryEvent? in
            try checkNotStopped(state)
            guard let event = state.next else { return nil }
            guard event.kind == .timer, event.step == name else {
                throw diverged(state, asked: "timer '\(name)'")
            }
            state.advance()
            return event
        }
        let deadline: Date
        if let recorded, let milliseconds = recorded.value.flatMap({ Int64($0) }) {
            deadline = Date(timeIntervalSince1970: Double(milliseconds) / 1000)
        } else {
            let target = Date().addingTimeInterval(Self.seconds(duration))
            try await engine.record(run: self, kind: .timer, name: name) {
                try await self.store.recordTimer(runID: self.runID, name: name, deadline: target, owner: self.engine.id)
            }
            deadline = target
        }
        let wait = deadline.timeIntervalSinceNow
        if wait > 0 { try await Task.sleep(for: Self.sleepDuration(seconds: wait)) }
    }

    /// Hops to `step` and decodes its output as `T` (`nil` when it unhopped without one).
    public func hop<T: Decodable>(to step: String, as type: T.Type) async throws -> T? {
        try await hop(to: step).decode(type)
    }

    // MARK: Decisions

    /// Reads a condition once and records its value; replay returns the recorded value, so
    /// the run takes the same branch it took before a crash.
    ///
    /// - Parameter name: unique within the run's path, e.g. `"terms-accepted"`.
    public func decide<T: Codable & Sendable>(_ name: String, _ read: @Sendable () async throws -> T) async throws -> T {
        let recorded = try state.withLock { state -> String?? in
            try checkNotStopped(state)
            guard let event = state.next else { return .none }
            guard event.kind == .decision, event.step == name else {
                throw diverged(state, asked: "decision '\(name)'")
            }
            state.advance()
            return .some(event.value)
        }
        if let recorded {
            return try JSONCoding.decode(T.self, from: recorded ?? "null", what: "the recorded decision '\(name)'")
        }
        let value = try await read()
        try await engine.record(run: self, kind: .decision, name: name) {
            try await self.store.recordDecision(
                runID: self.runID, name: name, value: try JSONCoding.encode(value), owner: self.engine.id)
        }
        return value
    }

    /// Whether the run's subject has never used `feature` (or it was reset): recorded as a decision.
    public func isFirstUse(_ feature: String) async throws -> Bool {
        try await decide("isFirstUse(\(feature))") { try await self.store.isFirstUse(subject: self.subject, feature: feature) }
    }

    /// The subject's stored session, without its token: recorded as a decision.
    /// Read the token itself from ``HopStore/session(subject:)`` in a step.
    public func session() async throws -> SessionInfo? {
        try await decide("session") {
            try await self.store.session(subject: self.subject).map {
                SessionInfo(userID: $0.userID, createdAt: $0.createdAt, expiresAt: $0.expiresAt)
            }
        }
    }

    /// The daemon's fact `key` about the subject: recorded as a decision.
    public func fact(_ key: String) async throws -> String? {
        try await decide("fact(\(key))") { try await self.store.fact(subject: self.subject, key: key) }
    }

    // MARK: Effects

    /// Marks `feature` used by the subject, exactly once for this run (recorded with the flag, in one transaction).
    public func markUsed(_ feature: String) async throws {
        let name = HopStore.markUsedEffect(feature)
        let replayed = try state.withLock { state -> Bool in
            try checkNotStopped(state)
            guard let event = state.next else { return false }
            guard event.kind == .effect, event.step == name else {
                throw diverged(state, asked: "effect '\(name)'")
            }
            state.advance()
            return true
        }
        if replayed { return }
        try await engine.record(run: self, kind: .effect, name: name) {
            try await self.store.markUsed(runID: self.runID, feature: feature, owner: self.engine.id)
        }
    }

    // MARK: Replay bookkeeping

    /// Called when the body returns: history the code no longer reaches is a divergence too.
    func finish() throws {
        try state.withLock { state in
            try checkNotStopped(state)
            if state.next != nil { throw diverged(state, asked: "the end of the flow") }
        }
    }

    func stop(_ error: Error) {
        state.withLock { if $0.stopped == nil { $0.stopped = error } }
    }

    private func checkNotStopped(_ state: ReplayState) throws {
        if let stopped = state.stopped { throw stopped }
    }

    private func diverged(_ state: ReplayState, asked: String) -> HopEngineError {
        let recorded = state.next.map { event in
            "\(event.kind.rawValue) '\(event.step ?? "")' (history entry \(event.seq))"
        } ?? "nothing more"
        return HopEngineError(
            .diverged,
            "run \(runID) of flow '\(flow)' for subject '\(subject)' diverged: its history recorded \(recorded), "
                + "but the flow code (version \(definition.version); the run started with version \(startedVersion)) asks for \(asked). "
                + "The run is stopped and not advanced. Start it over with `hopctl restart --flow \(flow) --subject \(subject)`.")
    }
}
