import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import Testing

/// A fleet's times go by the PostgreSQL server's clock, whatever its machines' clocks say: the
/// deadlines of durable sleeps and step timeouts, session expiry, and what hopctl reports. Each
/// test runs a daemon or hopctl with a wall clock two minutes off this machine's (``ClockSkew``). Before, each engine judged them by its own clock: an engine whose
/// clock was behind recorded deadlines that another engine found long past, and ended sleeps and
/// steps at once; one whose clock was ahead removed sessions as soon as they were stored.
@Suite(.serialized) struct ServerClockProcessTests {
    static var enabled: Bool { PostgresProcessTests.available }

    /// An engine whose clock is off records a durable sleep and a parked step with a timeout;
    /// it is killed, and another engine, whose clock is right, takes its runs over. The sleep
    /// and the step end ten seconds after they began, by the server's clock: not at once (the
    /// recording engine's clock behind) nor two minutes late (ahead).
    @Test(.enabled(if: enabled), arguments: [-120, 120])
    func deadlinesRecordedByAnEngineWhoseClockIsOffHoldForTheEngineThatTakesItsRunsOver(offset: Int) async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let launched = Date()
        // mixed-1 sleeps 10 s; mixed-2 parks on `wait` with a timeout of 10 s.
        let owner = try await PostgresProcessTests.daemon(
            "A", clockOff: offset, lease: 60, url: url, in: folder, arguments: ["--mixed", "3"], keepInputOpen: true)
        defer { owner.kill() }
        try await owner.waitForOutput("started 3", timeout: .seconds(30))
        let started = Date()
        let store = try await PostgresStore.open(url: url)
        defer { Task { await store.close() } }
        let napping = try #require(try await store.latestRun(flow: "mixed", subject: "mixed-1"))
        let waiting = try #require(try await store.latestRun(flow: "mixed", subject: "mixed-2"))
        let timer = try #require(try await store.history(runID: napping.id).first { $0.kind == .timer })
        let sleepEnd = Date(timeIntervalSince1970: Double(Int64(timer.value ?? "") ?? 0) / 1000)
        // From the hop itself: on a loaded machine the step may have timed out already.
        struct Stored: Decodable { var deadline: Int64 }
        let hop = try #require(try await store.history(runID: waiting.id).first { $0.kind == .hop })
        let stored = try JSONDecoder().decode(Stored.self, from: Data((hop.value ?? "").utf8))
        let timeout = Date(timeIntervalSince1970: Double(stored.deadline) / 1000)
        // Ten seconds after a time between A's launch and its report, by this machine's clock.
        for (what, deadline) in [("the sleep's end", sleepEnd), ("the step's deadline", timeout)] {
            #expect(
                deadline >= launched.addingTimeInterval(9) && deadline <= started.addingTimeInterval(11),
                "\(what) is \(deadline.timeIntervalSince(started)) s after A started its runs, not 10")
        }

        owner.kill()
        try await owner.waitForExit()
        let other = try PostgresProcessTests.daemon(
            "B", url: url, in: folder, arguments: ["--mixed", "3"], keepInputOpen: true)
        defer { other.kill() }
        func entry(_ runID: Int64, _ matches: @escaping (HistoryEntry) -> Bool) async throws -> HistoryEntry? {
            try await store.history(runID: runID).first(where: matches)
        }
        try await waitUntil("B ends the sleep and times the step out", timeout: .seconds(40)) {
            let woke = try await entry(napping.id) { $0.kind == .hop && $0.step == "done" }
            let timedOut = try await entry(waiting.id) { $0.kind == .timeout }
            return woke != nil && timedOut != nil
        }
        let woke = try #require(try await entry(napping.id) { $0.kind == .hop && $0.step == "done" })
        let timedOut = try #require(try await entry(waiting.id) { $0.kind == .timeout })
        // B takes A's runs over once A's liveness lock is gone and the database's first 15 s
        // (counted from A's start, the first engine the server answered) are over: about 15 s
        // after A started, more on a loaded machine. Two minutes late (deadlines by A's clock,
        // ahead) would be well past the bound; at once (behind), before the first.
        for (what, entry) in [("the sleep ended", woke), ("the step timed out", timedOut)] {
            let after = entry.at.timeIntervalSince(launched)
            #expect(after >= 9.5, "\(what) \(after) s after A was launched: before its 10 s were up")
            #expect(
                entry.at <= started.addingTimeInterval(40),
                "\(what) \(entry.at.timeIntervalSince(started)) s after A started its runs: late")
        }
    }

    /// A session stored with an expiry twelve seconds away (by this machine's clock, which is the
    /// server's) is removed by an engine whose clock is off when those twelve seconds are up: not as
    /// soon as it is stored (the engine's clock ahead) nor two minutes late (behind).
    @Test(.enabled(if: enabled), arguments: [120, -120])
    func anEngineWhoseClockIsOffExpiresASessionWhenItsExpiryComes(offset: Int) async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let engine = try await PostgresProcessTests.daemon("A", clockOff: offset, lease: 60, url: url, in: folder)
        defer { engine.kill() }
        try await engine.waitForOutput("parked onboarding", timeout: .seconds(30))  // its watch runs
        let store = try await PostgresStore.open(url: url)
        defer { Task { await store.close() } }
        // Twelve seconds: the engine measures the server's clock again meanwhile (every 10 s).
        let expiry = Date().addingTimeInterval(12)
        try await store.storeSession(subject: "other", userID: "alice", token: "secret", expiresAt: expiry)
        // The row itself: a read of the session leaves out an expired one whether or not it was removed.
        func stored() async throws -> Bool {
            try await TestDatabases.shared.psql("SELECT count(*) FROM sessions", in: folder)
                .trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }
        #expect(try await stored())
        try await waitUntil("A removes the expired session", timeout: .seconds(30)) { try await !stored() }
        let removed = Date()
        #expect(
            removed >= expiry.addingTimeInterval(-0.5),
            "removed \(expiry.timeIntervalSince(removed)) s before its expiry")
        #expect(removed <= expiry.addingTimeInterval(5), "removed \(removed.timeIntervalSince(expiry)) s late")
    }

    /// hopctl on a machine whose clock is off: `session login --expires-in` counts from the
    /// server's time, and `status` judges a lease by it.
    @Test(.enabled(if: enabled))
    func hopctlOnAMachineWhoseClockIsOffCountsExpiriesAndLeasesByTheServersClock() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        func hopctl(_ offset: Int, _ arguments: [String]) async throws -> (status: Int32, stdout: String) {
            let result = try await run(
                "hopctl", arguments + ["--db", url],
                environment: try await ClockSkew.environment(offBy: offset, in: folder), in: folder)
            #expect(result.status == 0, "hopctl \(arguments): \(result.stderr)")
            return (result.status, result.stdout)
        }

        // Two minutes behind: a session of a minute would have expired a minute before it was stored.
        _ = try await hopctl(-120, ["session", "login", "alice", "--subject", "kiosk", "--expires-in", "60s"])
        let store = try await PostgresStore.open(url: url)
        defer { Task { await store.close() } }
        let session = try #require(try await store.session(subject: "kiosk"), "the session expired as it was stored")
        let lasts = try #require(session.expiresAt).timeIntervalSinceNow
        #expect(lasts > 50 && lasts <= 61, "the session expires in \(lasts) s, not 60")

        // A daemon holds run 1 on a lease of a minute; hopctl two minutes ahead sees it live.
        let daemon = try PostgresProcessTests.daemon("A", url: url, in: folder, slowSplash: true)
        defer { daemon.kill() }
        try await daemon.waitForOutput("point after:hop:splash")
        let status = try await hopctl(120, ["status", "--flow", "startup", "--json"])
        let listed = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [[String: Any]]
        let runs = try #require(listed, "\(status.stdout)")
        #expect(runs.first?["owner"] as? String == "A")
        #expect(runs.first?["lease_live"] as? Bool == true, "\(status.stdout)")
    }
}
