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
