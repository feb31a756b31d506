import Foundation

/// What a flow body sees of its run: hop to steps, read conditions, change stored state.
///
/// Each call is committed to the run's history before it returns; when the run is executed
/// again (after a crash or an external unhop), calls already in the history return their
/// recorded result without doing their work again. The context only describes what the body
/// asks for; the run's executor does it (see `RunExecutor`), and replay decides what is new
/// (see `Replay`).
public final class FlowContext: Sendable {
    /// The flow name.
    public var flow: String { executor.run.flow }
    /// Whom the run is for.
    public var subject: String { executor.run.subject }
    /// The run id, as `hopctl status` shows it.
    public var runID: Int64 { executor.run.id }
    /// The flow version the run was started with.
    public var startedVersion: String { executor.run.flowVersion }

    private let executor: any FlowExecution

    init(executor: any FlowExecution) { self.executor = executor }

    /// Whether the run is still replaying its history (the calls return recorded results).
    public var isReplaying: Bool { executor.isReplaying }

    // MARK: Hops

    /// Hops to `step` and returns when it unhops, with its output: the code after this call is the `then`.
    ///
    /// The hop is committed before the step runs; a step already unhopped in the history is
    /// not run again. A step that was in flight when the run was interrupted runs again.
    /// This returns when the step's body returns; its unhop (its own ``StepContext/unhop()``, or
    /// its return without one) is written with the run's next record (its next hop, decision,
    /// effect, timer or completion), in the same write, or on its own a few milliseconds later,
    /// and is durable as a coalesced record then: call ``makeDurable()`` before telling the
    /// outside world that the step ended.
    /// An external step parks the run: the body stops here and continues, from the top with
    /// replay, once the step is unhopped.
    ///
    /// - Parameters:
    ///   - step: the registered step to enter.
    ///   - timeout: how long the step may take. The deadline is stored with the hop, so it holds
    ///     across restarts; when it passes first, the step is ended (an in-process step's task is
    ///     cancelled) and the result's ``StepOutput/timedOut`` is `true`: take the timeout branch.
    ///   - transition: runs before the hop is recorded, instead of the flow's transition.
    @discardableResult
    public func hop(
        to step: String, timeout: Duration? = nil, transition: (@Sendable (Transition) async throws -> Void)? = nil
    ) async throws -> StepOutput {
        try await executor.hop(to: step, timeout: timeout, transition: transition)
    }

    /// Hops to `step` and decodes its output as `T` (`nil` when it unhopped without one).
    public func hop<T: Decodable>(to step: String, as type: T.Type) async throws -> T? {
        try await hop(to: step).decode(type)
    }

    // MARK: Timers

    /// Sleeps durably: the deadline is recorded, so a run resumed after a restart wakes at the
    /// original deadline, not a fresh one (at once when it has passed).
    ///
    /// - Parameters:
    ///   - duration: how long to sleep, from the first time the run reaches this call.
    ///   - name: unique within the run's path when a flow sleeps more than once.
    public func sleep(for duration: Duration, name: String = "sleep") async throws {
        try await executor.sleep(for: duration, name: name)
    }

    // MARK: Decisions

    /// Reads a condition once and records its value; replay returns the recorded value, so
    /// the run takes the same branch it took before a crash.
    ///
    /// - Parameters:
    ///   - name: unique within the run's path, e.g. `"terms-accepted"`.
    ///   - read: reads the condition; called only when the history does not hold its value.
    ///
    /// The decision is durable with the run's next hop, or a few milliseconds later: a crash
    /// before that reads it again when the run resumes.
    public func decide<T: Codable & Sendable>(_ name: String, _ read: @Sendable () async throws -> T) async throws -> T
    {
        try await executor.decide(name, read)
    }

    /// Whether the run's subject has never used `feature` (or it was reset): recorded as a decision.
    public func isFirstUse(_ feature: String) async throws -> Bool {
        try await executor.isFirstUse(feature)
    }

    /// The subject's stored session, without its token: recorded as a decision.
    /// A step reads the token itself with ``StepContext/session()``.
    public func session() async throws -> SessionInfo? {
        try await executor.session()
    }

    /// The daemon's fact `key` about the subject: recorded as a decision.
    public func fact(_ key: String) async throws -> String? {
        try await executor.fact(key)
    }

    // MARK: Patches

    /// Whether the run takes the new branch of a change to this version's code.
    ///
    /// ```swift
    /// if try await flow.patched("terms-screen") {
    ///     try await flow.hop(to: "terms")  // what runs started from now on do
    /// }
    /// ```
    ///
    /// A run that reaches the call for the first time takes the new branch, and its history
    /// records a marker. A run that replays a history recorded before the patch existed takes the
    /// old branch where the marker is absent, so runs in flight finish on the path they started.
    /// Retire a patch by deleting the call and its old branch once no unfinished run needs that
    /// branch (`hopctl patches --flow F --patch NAME` lists them); the markers left in histories
    /// are then passed over.
    ///
    /// - Parameter name: unique within the flow, e.g. `"terms-screen"`.
    public func patched(_ name: String) async throws -> Bool {
        try await executor.patched(name)
    }

    // MARK: Effects

    /// Marks `feature` used by the subject, exactly once for this run (recorded with the flag, in one transaction).
    ///
    /// Returns once the flag is set and seen by this engine; it is durable, and seen by other
    /// processes, with the run's next hop (or a few milliseconds later): call ``makeDurable()``
    /// after it when another process must see the flag at once.
    public func markUsed(_ feature: String) async throws {
        try await executor.markUsed(feature)
    }

    // MARK: Durability

    /// Makes every record of the run so far durable now — its decisions, patch markers, effects
    /// and unhops, which otherwise become durable with its next hop or a few milliseconds later.
    ///
    /// Call it before the flow body tells the outside world about something it recorded: then
    /// a crash can no longer undo it.
    public func makeDurable() async throws {
        try await executor.makeDurable()
    }
}
