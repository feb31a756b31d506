import HopEngine

/// The start-up flow of CLHoppingViewController's example: splash, onboarding on first use, login when no session is stored, main.
let startupFlow = Flow("startup", version: "1") { flow in
    try await flow.hop(to: "splash")
    if try await flow.isFirstUse("onboarding") {
        try await flow.hop(to: "onboarding")
        try await flow.markUsed("onboarding")
    }
    if try await flow.session() == nil {
        try await flow.hop(to: "login")
    }
    try await flow.hop(to: "main")
}

/// Registers the steps of the start-up flow: splash and main run in the daemon; onboarding
/// and login are finished from outside (`hopctl unhop`, `hopctl session login`).
func registerStartupSteps(on engine: HopEngine) {
    engine.register(startupFlow)
    engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 3)) { _ in
        // Reloading cached state.
        try await Task.sleep(for: .milliseconds(500))
    }
    engine.register(step: "onboarding", .external)
    engine.register(step: "login", .external(unhopWhen: .sessionStored))
    engine.register(step: "main") { _ in }
}
