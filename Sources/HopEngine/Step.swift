import HopStore
import Synchronization

/// A self-contained step: it does its work and reports that it finished by unhopping.
///
/// Returning without calling ``StepContext/unhop()`` unhops the step with no output.
/// Throwing fails the attempt; the step's ``RetryPolicy`` decides whether it runs again.
/// A step may run again after a crash (at-least-once): make its effects idempotent.
public protocol HopStep: Sendable {
    func run(_ step: StepContext) async throws
}

/// A step whose work is a closure.
struct ClosureStep: HopStep {
    let body: @Sendable (StepContext) async throws -> Void
    func run(_ step: StepContext) async throws { try await body(step) }
}

/// How often a failing step is tried, and how long to wait between tries.
public struct RetryPolicy: Sendable, Equatable {
    /// Tries in all, the first included; at least 1.
    public var maxAttempts: Int
    /// Wait before the second try; doubled for each further try, up to `maxBackoff`.
    public var initialBackoff: Duration
    /// The longest wait between two tries.
    public var maxBackoff: Duration

    public init(maxAttempts: Int, initialBackoff: Duration = .milliseconds(100), maxBackoff: Duration = .seconds(30)) {
        self.maxAttempts = max(1, maxAttempts)
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }

    /// One try: a throwing step fails the run.
    public static let none = RetryPolicy(maxAttempts: 1)

    func backoff(afterAttempt attempt: Int) -> Duration {
        var wait = initialBackoff
        for _ in 1..<max(1, attempt) where wait < maxBackoff { wait *= 2 }
        return min(wait, maxBackoff)
    }
}

/// A step that is finished from outside the engine: by ``HopEngine/unhop(flow:subject:token:output:)``,
/// by `hopctl unhop`, or by a stored change. While it waits, its run holds no task and no memory.
public struct ExternalStep: Sendable {
    let wakeOn: WakeCondition?

    /// Finished by an explicit unhop only.
    public static let external = ExternalStep(wakeOn: nil)

    /// Finished by an explicit unhop, or when `condition` happens (e.g. a session is stored by `hopctl session login`).
    public static func external(unhopWhen condition: WakeCondition) -> ExternalStep { ExternalStep(wakeOn: condition) }
}

/// What a step sees of its run (CLHoppingViewController's `hoppingViewController` accessor): who it runs
/// for, the run's stored state, and ``unhop()``.
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
    /// The run's database: first-use flags, sessions, facts.
    public let store: HopStore
    let unhopper: Unhopper

    /// Reports that the step finished, with no output.
    public func unhop() async throws {
        try await unhopper.unhop(output: nil)
    }

    /// Reports that the step finished, with `output` (stored as JSON in the history and
    /// returned by the flow's ``FlowRun/hop(to:transition:)``).
    public func unhop(output: some Encodable & Sendable) async throws {
        try await unhopper.unhop(output: try JSONCoding.encode(output))
    }
}

/// Records the unhop of one in-process hop and remembers that it happened.
final class Unhopper: Sendable {
    private let engine: HopEngine
    private let run: FlowRun
    private let step: String
    private let token: String
    private let done = Mutex<(unhopped: Bool, output: String?)>((false, nil))

    init(engine: HopEngine, run: FlowRun, step: String, token: String) {
        self.engine = engine
        self.run = run
        self.step = step
        self.token = token
    }

    func unhop(output: String?) async throws {
        try await engine.record(run: run, kind: .unhop, name: step) {
            try await self.engine.store.recordUnhop(runID: self.run.runID, token: self.token, output: output, owner: self.engine.id)
        }
        engine.metrics.unhops.increment()
        done.withLock { $0 = (true, output) }
    }

    var result: (unhopped: Bool, output: String?) { done.withLock { $0 } }
}
