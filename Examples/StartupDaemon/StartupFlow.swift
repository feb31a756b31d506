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

/// Version 2 of the start-up flow: the terms of use follow onboarding. Runs that started on
/// version 1 finish on version 1, which stays registered beside it.
let startupFlowV2 = Flow("startup", version: "2") { flow in
    try await flow.hop(to: "splash")
    if try await flow.isFirstUse("onboarding") {
        try await flow.hop(to: "onboarding")
        try await flow.hop(to: "terms")
        try await flow.markUsed("onboarding")
    }
    if try await flow.session() == nil {
        try await flow.hop(to: "login")
    }
    try await flow.hop(to: "main")
}

/// Registers the steps of the start-up flow: splash and main run in the daemon; onboarding, terms
/// and login are finished from outside (`hopctl unhop`, `hopctl session login`). With `newest`
/// "2", version 2 is registered beside version 1 and new runs start on it.
func registerStartupSteps(on engine: HopEngine, newest: String = "1") {
    engine.register(startupFlow)
    if newest == "2" { engine.register(startupFlowV2) }
    engine.register(step: "terms", .external)
    engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 3)) { _ in
        // Reloading cached state.
        try await Task.sleep(for: .milliseconds(500))
    }
    engine.register(step: "onboarding", .external)
    engine.register(step: "login", .external(unhopWhen: .sessionStored))
    engine.register(step: "main") { _ in }
}
