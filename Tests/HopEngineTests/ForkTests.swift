import Foundation
import HopEngine
import HopTestSupport
import Logging
import Synchronization
import Testing

/// Recovering a diverged run: a new run takes its history up to an entry as done.
@Suite struct ForkTests {
    /// The start-up flow as version 1 was first shipped.
    static let shipped = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            try await flow.markUsed("onboarding")
        }
        try await flow.hop(to: "profile")
        if try await flow.session() == nil { try await flow.hop(to: "login") }
        try await flow.hop(to: "main")
    }

    /// Version 1 changed in place (no patch): the profile step is gone.
    static let changed = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            try await flow.markUsed("onboarding")
        }
        if try await flow.session() == nil { try await flow.hop(to: "login") }
        try await flow.hop(to: "main")
    }

    static func engine(_ storage: any HopStorage, _ flow: Flow, bodies: Bodies) -> HopEngine {
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(flow)
        for step in ["splash", "profile", "main"] {
            engine.register(step: step) { context in
                bodies.lines.withLock { $0.append("\(context.runID) \(context.step)") }
            }
        }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        return engine
    }

    @Test(arguments: TestBackend.all)
    func aDivergedRunForkedFromAnyEntryCompletesWithoutRunningAStepBeforeItAgain(backend: TestBackend) async throws {
        // The diverged run: shipped code ran it into login; changed code replays it and diverges.
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let store = try await backend.open(folder)  // hopctl's side of the database
        let bodies = Bodies()
        let shipped = Self.engine(storage, Self.shipped, bodies: bodies)
        let run = try await shipped.start("startup", subject: "kiosk-1")
        _ = try await shipped.settled(runID: run.id)
        try await shipped.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
        #expect(try await shipped.settled(runID: run.id)?.currentStep == "login")
        try await store.storeSession(subject: "kiosk-1", userID: "alice", token: "t")
        let changed = Self.engine(storage, Self.changed, bodies: bodies)
        #expect(try await changed.resumeAll() == 1)
        #expect(try await changed.settled(runID: run.id)?.status == .diverged)
        let history = try await storage.history(runID: run.id)
        // The possible entries: up to the last one the changed code agrees with.
        let message = try #require(history.last { $0.kind == .diverge }?.value)
        let disagreeing = try #require(message.firstMatch(of: /\(history entry (\d+)\)/).flatMap { Int64($0.1) })
        let last = disagreeing - 1

        var forkedFrom: [Int64] = []
        var previous = run.id
        for seq in 1...last {
            let before = bodies.lines.withLock { $0 }
            let fork: (old: RunRecord, new: RunRecord)
            do {
                fork = try await store.forkRun(
                    flow: "startup", subject: "kiosk-1", runID: run.id, through: seq, version: nil)
            } catch let error as HopError where error.code == .refused {
                // Only a cut inside a hop (its step would be in flight) is refused, and it changes nothing.
                #expect(error.reason.contains("in flight"), "entry \(seq): \(error)")
                #expect(try await storage.latestRun(flow: "startup", subject: "kiosk-1")?.id == previous)
                continue
            }
            forkedFrom.append(seq)
            previous = fork.new.id
            _ = try await changed.resumeAll()
            var state = try await changed.settled(runID: fork.new.id)
            if state?.status == .parked, state?.currentStep == "onboarding" {
                // Taken over before onboarding ended: onboarding is entered again, and finished again.
                try await changed.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
                state = try await changed.settled(runID: fork.new.id)
            }
            #expect(state?.status == .completed, "forked through entry \(seq): \(String(describing: state))")
            // No step whose unhop was taken over ran again in the new run.
            let done = history.filter { $0.seq <= seq && $0.kind == .unhop }.compactMap(\.step)
            let ranAgain = bodies.lines.withLock { $0 }.dropFirst(before.count).filter { line in
                done.contains { line == "\(fork.new.id) \($0)" }
            }
            #expect(ranAgain.isEmpty, "forked through entry \(seq), ran again: \(ranAgain)")
            let links = try await storage.history(runID: fork.new.id).first
            #expect(links?.kind == .fork && links?.value == #"{"from":\#(run.id),"through":\#(seq)}"#)
        }
        #expect(forkedFrom.count >= last / 2, "forked from \(forkedFrom) of 1…\(last)")
        let old = try await storage.history(runID: run.id).filter { $0.kind == .fork }
        #expect(old.count == forkedFrom.count, "every fork is linked from the old run")
    }
}

/// The step bodies that ran, as "run step" lines.
final class Bodies: Sendable {
    let lines = Mutex<[String]>([])
}
