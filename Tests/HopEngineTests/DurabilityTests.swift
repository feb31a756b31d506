import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging
import Synchronization
import Testing

/// When a run's records are durable: coalesced between hops, committed with the next hop, the
/// completion, `makeDurable()`, or the commit delay; and what each call returns after.
@Suite struct DurabilityTests {
    static let quiet = Logger(label: "durability", factory: { _ in SwiftLogNoOpLogHandler() })

    /// An engine on a store whose coalesced records wait `commitDelay` for a commit, running
    /// `hop splash → markUsed(onboarding) → [makeDurable] → (held at the gate) → hop main`.
    static func engine(
        _ folder: TemporaryDirectory, commitDelay: Duration, makeDurable: Bool, gate: Gate
    ) async throws -> HopEngine {
        var options = HopStore.Options()
        options.commitDelay = commitDelay
        let store = try await HopStore.open(path: folder.database, options: options)
        let engine = HopEngine(store: store, logger: quiet)
        engine.register(
            Flow("startup", version: "1") { flow in
                try await flow.hop(to: "splash")
                try await flow.markUsed("onboarding")
                if makeDurable { try await flow.makeDurable() }
                await gate.wait()
                try await flow.hop(to: "main")
            })
        for step in ["splash", "main"] { engine.register(step: step) { _ in } }
        return engine
    }

    /// What another process sees: a connection of its own.
    static func flagSeenElsewhere(_ folder: TemporaryDirectory) async throws -> Bool {
        let other = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        return try await !other.isFirstUse(subject: "default", feature: "onboarding")
    }

    @Test func flowMakeDurableCommitsAnEffectBeforeTheBodyGoesOn() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let engine = try await Self.engine(folder, commitDelay: .seconds(600), makeDurable: true, gate: gate)
        let run = try await engine.start("startup")
        try await waitUntil("another process sees the flag") {
            try await Self.flagSeenElsewhere(folder)
        }
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    @Test func withoutMakeDurableAnEffectIsSeenHereAtOnceAndElsewhereOnlyOnceCommitted() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let engine = try await Self.engine(folder, commitDelay: .seconds(600), makeDurable: false, gate: gate)
        let run = try await engine.start("startup")
        try await waitUntil("this engine sees the flag") {
            try await !engine.storage.isFirstUse(subject: "default", feature: "onboarding")
        }
        #expect(try await !Self.flagSeenElsewhere(folder), "the effect was committed on its own")
        try await engine.makeDurable()
        #expect(try await Self.flagSeenElsewhere(folder))
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    @Test func withNothingElseToCommitItAnEffectIsDurableWithinTheCommitDelay() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let engine = try await Self.engine(folder, commitDelay: .milliseconds(2), makeDurable: false, gate: gate)
        let run = try await engine.start("startup")
        try await waitUntil("another process sees the flag") {
            try await Self.flagSeenElsewhere(folder)
        }
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    @Test func aStartedRunAndACompletedRunAreDurableWhenTheCallsReturn() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        gate.open()
        let engine = try await Self.engine(folder, commitDelay: .seconds(600), makeDurable: false, gate: gate)
        let other = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        let run = try await engine.start("startup")
        #expect(try await other.run(id: run.id) != nil, "start returned before the run was durable")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await other.run(id: run.id)?.status == .completed, "settled returned before the completion was durable")
        #expect(
            try await other.history(runID: run.id).map(\.kind) == [.hop, .unhop, .effect, .hop, .unhop, .complete])
    }
}
