import Foundation
import HopEngine
import HopStore
import Logging
import ServiceLifecycle

/// Starts (or resumes) the start-up flow, narrates it, and ends once the run is over, so
/// that the service group shuts the engine down with it. With `auto`, it finishes the
/// external steps itself after a short pause.
struct DemoService: Service {
    let engine: HopEngine
    let events: AsyncStream<EngineEvent>
    let narrator: Narrator
    let subject: String
    let auto: Bool

    func run() async throws {
        let store = engine.store
        let existing = try await store.latestRun(flow: "startup", subject: subject)
        if let existing, existing.status.isUnfinished {
            let at = existing.currentStep.map { "at \($0)" } ?? "from its last step"
            narrator.say("resuming run \(existing.id) of startup for \(subject) \(at)")
        }
        let run = try await engine.start("startup", subject: subject)
        if existing?.id != run.id { narrator.say("run \(run.id) of startup for \(subject): started") }
        var parkedStep: String?
        if run.status == .parked, let step = run.currentStep {
            parkedStep = step
            try await parked(on: step)
        }

        for await event in events.cancelOnGracefulShutdown() {
            switch event {
            case .recorded(let reference, let entry) where reference.id == run.id:
                narrator.recorded(entry, subject: subject)
            case .settled(let record) where record.id == run.id:
                switch record.status {
                case .parked:
                    parkedStep = record.currentStep
                    try await parked(on: record.currentStep ?? "?")
                case .running: continue
                default:
                    try await summary(record)
                    return
                }
            case .executing(let reference, _) where reference.id == run.id:
                if let step = parkedStep {
                    narrator.say("\(step) finished: run \(run.id) continues")
                    parkedStep = nil
                }
            default: continue
            }
        }
        if let record = try await store.run(id: run.id), record.status.isUnfinished {
            narrator.say("stopping; run \(run.id) stays resumable\(record.currentStep.map { " at \($0)" } ?? "")")
        }
    }

    private func parked(on step: String) async throws {
        narrator.say("parked at \(step)")
        guard auto else { return narrator.waiting(on: step, subject: subject) }
        narrator.note("--auto: finishing \(step) in a moment")
        try await Task.sleep(for: .seconds(1))
        if step == "login" {
            try await engine.storeSession(subject: subject, userID: "alice", token: Token.random(byteCount: 32))
        } else if let inFlight = try await engine.inFlight(flow: "startup", subject: subject), inFlight.step == step {
            try await engine.unhop(flow: "startup", subject: subject, token: inFlight.token, output: ["accepted": true])
        }
    }

    private func summary(_ run: RunRecord) async throws {
        let store = engine.store
        narrator.say("run \(run.id) is \(run.status.rawValue)")
        let flags = try await store.firstUseFlags(subject: subject).map(\.feature)
        let session = try await store.session(subject: subject)
        let runs = try await store.allRuns(flow: "startup", subject: subject)
        narrator.note("stored state for \(subject): used \(flags.isEmpty ? "nothing yet" : flags.joined(separator: ", ")); "
            + "session \(session.map { "of \($0.userID) (token \(StoredSession.redact($0.token)))" } ?? "none"); "
            + "\(runs.count) run\(runs.count == 1 ? "" : "s") of startup")
    }
}
