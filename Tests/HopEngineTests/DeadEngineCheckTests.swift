import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging
import Testing

/// How often a running engine looks for engines whose process is gone.
@Suite struct DeadEngineCheckTests {
    /// The watch looks for engines that are gone every ``HopEngine/Configuration/deadEngineCheckInterval``,
    /// not at every poll. Before, it looked at every poll: on PostgreSQL each look walks the
    /// owners of the running runs and reads the server's locks (3.5–6 ms with 200 engines), and a
    /// fleet of N engines made N² of those reads 20 times a second. A run whose engine dies
    /// while this one watches is still taken over without waiting for its lease (ten minutes here).
    ///
    /// The interval (3 s) is long beside a poll (10 ms, and about 0.5 s under the whole suite on
    /// 2 cores, when the watch waits for the pool every test shares), so a watch that looked at
    /// every poll makes far more looks than the intervals allow, alone or loaded. With an
    /// interval of 500 ms, a loaded run's polls each lasted as long as an interval, and such a
    /// watch passed too.
    @Test func theWatchLooksForGoneEnginesEveryIntervalAndStillTakesTheirRunsOver() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let storage = FaultyStorage(store)
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            configuration: .init(pollInterval: .milliseconds(10), deadEngineCheckInterval: .seconds(3)))
        engine.register(Flow("f", version: "1") { flow in try await flow.hop(to: "work") })
        engine.register(step: "work") { _ in }
        // A run another engine, alive, holds with a lease of ten minutes, longer than the wait
        // below may last: it is taken over for its lock, never for its lease (the wait once
        // lasted 97 s, past a lease of a minute).
        let runID = try await store.startRun(flow: "f", subject: "a", version: "1").run.id
        var other: Incarnation? = store.makeIncarnation(label: "other")
        let otherID = try #require(other?.id)
        #expect(try await store.claim(runID: runID, owner: otherID, until: Date().addingTimeInterval(600)) != nil)

        let started = ContinuousClock.now
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        // A long deadline against a hang: under the whole suite on 2 cores, 100 polls took 51–97 s
        // (the watch waits for the pool, shared with every test). The check below counts the
        // looks against the intervals that the window actually lasted.
        try await waitUntil("the watch polled 100 times", timeout: .seconds(180)) {
            storage.calls("changeVersion()") >= 100
        }
        let looks = storage.calls("releaseRunsOfDeadIncarnations(except:)")
        let intervals = Int((ContinuousClock.now - started) / .seconds(3))
        // One as it started (the resume), then one per interval at most: within the 180 s the
        // wait allows, at most 62, against 100 for a watch that looks at every poll.
        #expect(looks >= 1 && looks <= intervals + 2, "\(looks) looks in \(intervals) intervals: \(storage.trace)")
        #expect(try await store.run(id: runID)?.owner == otherID, "a live engine's run was taken")

        other = nil  // its lock goes, as when its process dies
        try await waitUntil("the run is taken over and completes", timeout: .seconds(30)) {
            try await store.run(id: runID)?.status == .completed
        }
        #expect(try await store.history(runID: runID).contains { $0.kind == .takeover })
    }
}
