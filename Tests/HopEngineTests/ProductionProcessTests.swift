import Foundation
import HopStore
import HopTestSupport
import Testing

/// What a daemon running for months beside operators needs, shown with real processes.
@Suite struct ProductionProcessTests {
    @Test func aDaemonRestartedMidSleepWakesAtTheOriginalDeadline() async throws {
        let folder = try TemporaryDirectory()
        // Killed by itself once the sleep's timer is durable: a kill sent by the test on seeing that
        // came, once, after the 3 s sleep had ended (the whole suite on 2 cores), and the run was
        // already completed.
        let launched = Date()  // no later than the sleep's start
        let first = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--sleep", "3"],
            environment: ["HOP_TEST_KILL_AT": "after:timer:sleep"], directory: folder)
        try await first.waitForExit()
        #expect(first.stdout.contains("point after:timer:sleep") && !first.stdout.contains("before:decision"))

        let store = try await HopStore.open(path: folder.database)
        let runRecord = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        let timer = try #require(try await store.history(runID: runRecord.id).first { $0.kind == .timer })
        let deadline = Date(timeIntervalSince1970: Double(try #require(timer.value.flatMap { Int64($0) })) / 1000)
        // The deadline is the sleep's start plus 3 s: the sleep began after the daemon was
        // launched, and before the store wrote its entry (the entry's own time; 119 ms later once,
        // with the whole suite beside it on two cores). Bounds no load can break; times are
        // stored in milliseconds.
        #expect(deadline.timeIntervalSince(launched) >= 3 - 0.002, "deadline \(deadline), launched \(launched)")
        #expect(deadline.timeIntervalSince(timer.at) <= 3 + 0.002, "deadline \(deadline), written \(timer.at)")
        // Restart 1.5 s after the sleep began: a fresh 3 s sleep would end 1.5 s after the original deadline.
        try await waitUntil("1.5 s have passed since the sleep began") { Date().timeIntervalSince(timer.at) >= 1.5 }

        let relaunched = Date()  // no later than a sleep the second daemon would begin afresh
        let second = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--sleep", "3"], directory: folder)
        #expect(try await second.waitForExit() == 0)
        #expect(second.stdout.contains("settled completed"), "\(second.stdout)\(second.stderr)")
        let history = try await store.history(runID: runRecord.id)
        let nextHop = try #require(history.first { $0.kind == .hop && $0.seq > timer.seq })
        #expect(nextHop.at.timeIntervalSince(deadline) >= -0.01, "woke before the deadline")
        // At the original deadline, or at once if the daemon resumed after it. A fresh sleep
        // would have begun after the relaunch and woken 3 s later, at least 1.5 s past the
        // deadline: the wake came before any fresh sleep could end, however late a loaded
        // machine let the daemon resume (before, the wake was checked to be within 1 s of when
        // the test saw the resume, which a slow wake-up could break).
        #expect(
            nextHop.at.timeIntervalSince(relaunched) < 3 - 0.002,
            "woke \(nextHop.at.timeIntervalSince(deadline)) s after the original deadline, \(nextHop.at.timeIntervalSince(relaunched)) s after the relaunch"
        )
        #expect(history.filter { $0.kind == .timer }.count == 1)
    }

    /// A daemon stopped with SIGTERM (its service group cancels `engine.run()`) while a step
    /// that unhopped runs on, its unhop still held in memory: the engine writes the unhop and
    /// commits it before `run()` returns, so the step does not run again when the daemon
    /// starts again, and the run goes on from the step's end.
    @Test(arguments: TestBackend.all)
    func aStepsHeldUnhopIsDurableWhenTheDaemonStopsOnSIGTERM(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let arguments = ["--db", try await backend.location(folder), "--files", folder.database, "--external"]
        // Splash unhops and runs on (its input stays open); the unhop is held for up to 600 s.
        let first = try ChildProcess(
            "hop-test-daemon", arguments + ["--graceful"], environment: ["HOP_TEST_SPLASH_RUNS_ON": "1"],
            keepInputOpen: true, directory: folder)
        defer { first.kill() }
        // A daemon's start: the default deadline (a loaded CI machine took 15 s).
        try await waitUntil("splash unhopped and runs on") {
            bodyLines(in: folder).contains("1 splash-unhopped")
        }
        let store = try await backend.open(folder)
        #expect(try await store.history(runID: 1).map(\.kind) == [.hop], "the unhop is held, not written")

        first.kill(SIGTERM)
        #expect(try await first.waitForExit(timeout: .seconds(30)) == 0, "\(first.stdout)\(first.stderr)")
        #expect(first.stdout.contains("stopped"), "\(first.stdout)")
        #expect(bodyLines(in: folder).contains("1 splash-ran-on"), "the step was cancelled: \(bodyLines(in: folder))")
        let stopped = try await store.history(runID: 1)
        #expect(stopped.map(\.kind) == [.hop, .unhop] && stopped.last?.value?.contains("held") == true, "\(stopped)")
        let released = try await store.run(id: 1)
        #expect(released?.owner == nil, "released: \(String(describing: released)) \(first.stderr)")

        let second = try ChildProcess("hop-test-daemon", arguments, directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("parked onboarding", timeout: .seconds(30))
        #expect(
            bodyLines(in: folder).filter { $0 == "1 splash" }.count == 1, "splash ran again: \(bodyLines(in: folder))")
        let history = try await store.history(runID: 1)
        #expect(Array(history.prefix(2)) == stopped && history.filter { $0.kind == .unhop }.count == 1, "\(history)")
    }

    @Test func hopctlCancelCancelsTheTaskOfTheStepInFlightInTheDaemon() async throws {
        let folder = try TemporaryDirectory()
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external"], environment: ["HOP_TEST_SLOW_SPLASH": "1"],
            directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("point after:hop:splash")
        let cancel = try await run("hopctl", ["cancel", "--flow", "startup", "--db", folder.database], in: folder)
        #expect(cancel.status == 0, "\(cancel.stderr)")
        try await daemon.waitForOutput("settled cancelled")
        try await waitUntil("the splash task sees its cancellation") {
            bodyLines(in: folder).contains("1 splash-cancelled")
        }
        let store = try await HopStore.open(path: folder.database)
        let history = try await store.history(runID: 1)
        #expect(history.map(\.kind) == [.hop, .cancel])
        #expect(try await store.run(id: 1)?.status == .cancelled)
    }

    @Test func aSecondDaemonLeavesLeasedRunsAloneAndTakesThemOverWhenTheOwnerDies() async throws {
        let folder = try TemporaryDirectory()
        let owner = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--engine-id", "A", "--lease", "1"],
            environment: ["HOP_TEST_SLOW_SPLASH": "1"], directory: folder)
        defer { owner.kill() }
        try await owner.waitForOutput("point after:hop:splash")

        let other = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--engine-id", "B", "--lease", "1"],
            directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        #expect(!other.stdout.contains("executing run 1"), "B executed a run A holds")
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.run(id: 1)?.ownerLabel == "A")

        owner.kill()
        try await owner.waitForExit()
        try await other.waitForOutput("executing run 1 replaying 1")
        try await other.waitForOutput("parked onboarding")
        let bodies = bodyLines(in: folder)
        #expect(bodies.filter { $0 == "1 splash" }.count == 2, "the in-flight splash ran again in B: \(bodies)")
        #expect(try await store.history(runID: 1).filter { $0.kind == .hop && $0.step == "splash" }.count == 1)
    }

    @Test func aLogoutFromHopctlReRoutesTheFlowBackThroughLogin() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.markUsed(subject: "default", feature: "onboarding")
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked login")
        #expect(
            try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        try await daemon.waitForOutput("parked main")

        let logout = try await run("hopctl", ["session", "logout", "--db", folder.database], in: folder)
        #expect(logout.stdout.contains("run 1 was re-routed by the logout"), "\(logout.stdout)")
        // How soon is hop-bench's to measure; here: the running daemon notices the logout by itself.
        try await waitUntil("the daemon parks at login again") {
            daemon.stdout.components(separatedBy: "parked login").count == 3
        }
        let kinds = try await store.history(runID: 1).map { "\($0.kind.rawValue) \($0.step ?? "")" }
        #expect(kinds.suffix(4) == ["hop main", "reroute main", "decision session", "hop login"])
    }
}
