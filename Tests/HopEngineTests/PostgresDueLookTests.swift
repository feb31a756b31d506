import Foundation
import HopEngine
import HopPostgres
import HopStore
import HopTestSupport
import Logging
import Testing

/// An idle engine on PostgreSQL asks the server what is due (a parked run's deadline, a
/// session's expiry) once a second, not at every poll; a deadline or an expiry still comes on time.
@Suite struct PostgresDueLookTests {
    static let quiet = PostgresConnectionLossTests.quiet

    /// How many sessions the test's database stores, read with psql.
    static func sessions(in folder: TemporaryDirectory) async throws -> String {
        try await TestDatabases.shared.psql("SELECT count(*) FROM sessions", in: folder)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Before, the watch's look for due timeouts and expired sessions was two statements at every
    /// poll: an idle fleet of 20 engines made the server commit 880 transactions a second. Now an
    /// idle engine looks once per ``PostgresStore/dueLookEvery`` (1 s) whatever its poll.
    @Test(.enabled(if: PostgresProcessTests.available))
    func anIdleEngineLooksForWhatIsDueOnceASecondNotAtEveryPoll() async throws {
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: try await TestBackend.postgres.location(folder))
        let storage = FaultyStorage(store)
        let engine = HopEngine(
            storage: storage, logger: Self.quiet, configuration: .init(pollInterval: .milliseconds(10)))
        engine.register(Flow("f", version: "1") { flow in try await flow.hop(to: "work") })
        engine.register(step: "work") { _ in }
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        // Long deadlines against a hang, for a loaded machine: the count is per second of the window.
        try await waitUntil("the watch polled 20 times", timeout: .seconds(180)) {
            storage.calls("dueTimeouts(now:)") >= 20
        }
        let looksBefore = store.dueLooks.load(ordering: .relaxed)
        let started = ContinuousClock.now
        let pollsBefore = storage.calls("dueTimeouts(now:)")
        try await waitUntil("the watch polled 200 times more", timeout: .seconds(180)) {
            storage.calls("dueTimeouts(now:)") >= pollsBefore + 200
        }
        let looks = store.dueLooks.load(ordering: .relaxed) - looksBefore
        let seconds = Int((ContinuousClock.now - started) / .seconds(1))
        // One per second (and a few more, the first and the last partly in the window).
        #expect(looks <= seconds + 4, "\(looks) looks in \(seconds) s of 200 polls")
    }

    /// A session stored by another process, with a write that notifies no one (it woke no run),
    /// is removed once it expires, not before. (Within a look's second of its time; the test
    /// waits longer, for a loaded machine, so it checks the removal, not that second.)
    @Test(.enabled(if: PostgresProcessTests.available))
    func aSessionAnotherProcessStoredWithoutNotifyingIsRemovedOnceItExpires() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await PostgresStore.open(url: url)
        let events = SettledRuns()
        let engine = HopEngine(storage: store, logger: Self.quiet, configuration: .init(observer: events.observe))
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await waitUntil("the engine is ready") { events.ready }
        try await waitUntil("the engine looked at what is due") { store.dueLooks.load(ordering: .relaxed) > 0 }

        let other = try await PostgresStore.open(url: url)  // as `hopctl session login` would
        let expiry = other.now().addingTimeInterval(0.5)
        try await other.storeSession(subject: "kiosk", userID: "alice", token: Token.random(), expiresAt: expiry)
        // Within its expiry and the look's second; waited for longer, for a loaded machine. A look
        // trusted for as long as nothing notifies never removed it (this test failed so).
        try await waitUntil("the session is removed", timeout: .seconds(120)) {
            try await Self.sessions(in: folder) == "0"
        }
        #expect(other.now() >= expiry, "removed before its expiry")
        await other.close()
    }

    /// What the engine's own store writes, and what another store notifies, is seen at once: with
    /// looks trusted for an hour, a step this engine parks with a timeout times out, a session
    /// this engine's store stores with an expiry is removed when it expires, and so is one another
    /// store stores before a write that notifies.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aLookIsMadeAgainAfterAWriteOfItsOwnOrAChangeAnotherStoreNotified() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await PostgresStore.open(url: url)
        store.dueLookEvery = .seconds(3600)
        let events = SettledRuns()
        let engine = HopEngine(storage: store, logger: Self.quiet, configuration: .init(observer: events.observe))
        engine.register(
            Flow("f", version: "1") { flow in
                if try await flow.hop(to: "wait", timeout: .milliseconds(300)).timedOut {
                    try await flow.hop(to: "late")
                }
            })
        engine.register(step: "wait", .external)
        engine.register(step: "late") { _ in }
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await waitUntil("the engine is ready") { events.ready }
        try await waitUntil("the engine looked at what is due") { store.dueLooks.load(ordering: .relaxed) > 0 }

        // Parked by the engine itself, with a deadline. The waits below are deadlines against a
        // hang (a look never made again waits an hour here), long for a loaded machine: 20 s ran
        // out once early in a CI run, where this process's cooperative threads are all busy.
        let run = try await engine.start("f", subject: "parks")
        do {
            try await waitUntil("the step times out and the run completes", timeout: .seconds(120)) {
                try await store.run(id: run.id)?.status == .completed
            }
        } catch {
            let stored = try await store.run(id: run.id)
            Issue.record(
                "run \(stored?.status.rawValue ?? "gone") at \(stored?.currentStep ?? "-"), due \(String(describing: stored?.wakeAt)), now \(store.now()), looks \(store.dueLooks.load(ordering: .relaxed)): \(try await path(of: run.id, in: store))"
            )
            throw error
        }

        // Stored by the engine's own store (as its embedder does, through `engine.login`).
        try await store.storeSession(
            subject: "own", userID: "alice", token: Token.random(), expiresAt: store.now().addingTimeInterval(0.3))
        try await waitUntil("the session of its own store is removed", timeout: .seconds(120)) {
            try await Self.sessions(in: folder) == "0"
        }

        // Stored by another store, which tells no one; then a write of it that notifies.
        let other = try await PostgresStore.open(url: url)
        try await other.storeSession(
            subject: "other", userID: "bob", token: Token.random(), expiresAt: other.now().addingTimeInterval(0.3))
        _ = try await other.startRun(
            flow: "f", subject: "other", version: "1", owner: nil, until: nil, durability: .now)
        try await waitUntil("the session another store stored is removed", timeout: .seconds(120)) {
            try await Self.sessions(in: folder) == "0"
        }
        await other.close()
    }
}
