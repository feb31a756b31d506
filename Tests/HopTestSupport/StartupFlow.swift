import HopEngine

/// The product's start-up flow, as the tests and their helper processes run it.
public func startupFlow(version: String = "1", transition: (@Sendable (Transition) async throws -> Void)? = nil) -> Flow
{
    Flow("startup", version: version, transition: transition) { flow in
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
}

/// Registers the start-up flow with every step finishing at once.
public func registerInstantStartup(on engine: HopEngine) {
    engine.register(startupFlow())
    for step in ["splash", "onboarding", "login", "main"] { engine.register(step: step) { _ in } }
}
