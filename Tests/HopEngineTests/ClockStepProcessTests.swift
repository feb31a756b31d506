import Foundation
import HopStore
import HopTestSupport
import Testing

/// The wall clock of a machine is stepped while its daemons run: NTP setting the clock of a
/// device that booted with a stale one (a board without a real-time clock), an operator's
/// `date -s`. Its daemons share a SQLite file, so they share that clock; a step must not hand a
/// live engine's run to another.
@Suite(.serialized) struct ClockStepProcessTests {
    /// Two copies of a daemon on one database; A executes run 1 on a lease of a minute. The clock
    /// steps five minutes forward, and at once B looks for runs to take (a run only B can execute
    /// was started). A is alive and executing: B must leave run 1 to it. Before, a lease's end was
    /// a time by the wall clock, so the step expired every lease at once and B took run 1 over
    /// while A went on executing it: its step ran twice.
    @Test func aClockSteppedForwardPastTheLeasesLeavesALiveOwnersRunToIt() async throws {
        let folder = try TemporaryDirectory()
        let clock = try ClockSkew.Stepper(in: folder)
        let environment = try await clock.environment(in: folder)
        let owner = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--engine-id", "A", "--lease", "60"],
            environment: environment.merging(["HOP_TEST_SLOW_SPLASH": "1"]) { $1 }, directory: folder)
        defer { owner.kill() }
        try await owner.waitForOutput("point after:hop:splash")
        // B has version 2 too, which A has not: only B can take a run of version 2.
        let other = try ChildProcess(
            "hop-test-daemon",
            [
                "--db", folder.database, "--external", "--engine-id", "B", "--lease", "60", "--versions", "1,2",
                "--subject", "second", "--wait-all",
            ], environment: environment, directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        let store = try await HopStore.open(path: folder.database)
        try await waitUntil("B completes its own run") {
            try await store.latestRun(flow: "startup", subject: "second")?.status == .completed
        }

        try clock.step(to: 300)
        let started = try await run(
            "hopctl",
            ["start", "--flow", "startup", "--subject", "third", "--flow-version", "2", "--db", folder.database],
            environment: environment, in: folder)
        #expect(started.status == 0, "\(started.stderr)")
        let third = try #require(try await store.latestRun(flow: "startup", subject: "third"))
        try await waitUntil("B completes the run only it can execute") {
            try await store.run(id: third.id)?.status == .completed
        }
        #expect(!other.stdout.contains("executing run 1 "), "B took over the run A executes")
        #expect(try await store.run(id: 1)?.ownerLabel == "A")
        #expect(try await store.history(runID: 1).allSatisfy { $0.kind != .takeover })
        #expect(bodyLines(in: folder).filter { $0 == "1 splash" }.count == 1, "the splash ran twice")
    }

    /// A daemon's runs park on a step with a timeout of 10 s and sleep durably 10 s (`--mixed 3`);
    /// then the wall clock is stepped five minutes forward, or back. The step times out and the
    /// sleep ends 10 s after they began, by this test's monotonic clock. Before, a parked step's
    /// deadline was a time by the wall clock: the step timed out at once after a step forward,
    /// five minutes late after a step back.
    @Test(arguments: [300, -300])
    func aParkedStepTimesOutAndASleepEndsOnTimeWhenTheClockIsStepped(seconds: Int) async throws {
        let folder = try TemporaryDirectory()
        let clock = try ClockSkew.Stepper(in: folder)
        let launched = ContinuousClock.now
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--mixed", "3", "--lease", "60"],
            environment: try await clock.environment(in: folder), keepInputOpen: true, directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("started 3", timeout: .seconds(30))
        let started = ContinuousClock.now
        try clock.step(to: seconds)
        let store = try await HopStore.open(path: folder.database)
        let napping = try #require(try await store.latestRun(flow: "mixed", subject: "mixed-1"))
        let waiting = try #require(try await store.latestRun(flow: "mixed", subject: "mixed-2"))
        // Shown by the wall clock (this process's, not stepped): 10 s after the hop, not 5 min off.
        let shown = try #require(try await store.run(id: waiting.id)?.wakeAt).timeIntervalSinceNow
        #expect(shown > -1 && shown <= 10.5, "the step's deadline is shown \(shown) s away")

        try await waitUntil("the step times out", timeout: .seconds(40)) {
            try await store.history(runID: waiting.id).contains { $0.kind == .timeout }
        }
        let timedOut = ContinuousClock.now
        try await waitUntil("the sleep ends", timeout: .seconds(40)) {
            try await store.history(runID: napping.id).contains { $0.kind == .hop && $0.step == "done" }
        }
        let woke = ContinuousClock.now
        for (what, at) in [("the step timed out", timedOut), ("the sleep ended", woke)] {
            #expect(at - launched >= .seconds(9.5), "\(what) \(at - launched) after the daemon was launched")
            // Late by the step back would be 5 min; 30 s leaves a loaded machine room (16 s was seen).
            #expect(at - started <= .seconds(30), "\(what) \(at - started) after its runs started: late")
        }
    }

    /// As above, but the daemon is killed after the step of the clock and started again, so its
    /// deadlines are read back from the database: the step in process ("work", which times out
    /// after 10 s here), the durable sleep and the parked step. Each ends 10 s after it began,
    /// by this test's monotonic clock. Before, the deadlines of the step in process and of the
    /// sleep were read back as times by the wall clock (those a running daemon waits for by the
    /// monotonic clock): they ended at once after a step forward, five minutes late after a step back.
    @Test(arguments: [300, -300])
    func deadlinesReadBackAfterARestartEndOnTimeWhenTheClockWasStepped(seconds: Int) async throws {
        let folder = try TemporaryDirectory()
        let clock = try ClockSkew.Stepper(in: folder)
        let (first, arguments, environment, launched, started) = try await Self.mixedDaemon(in: folder, clock: clock)
        defer { first.kill() }
        try clock.step(to: seconds)
        first.kill()
        try await first.waitForExit()
        let second = try ChildProcess(
            "hop-test-daemon", arguments, environment: environment, keepInputOpen: true, directory: folder)
        defer { second.kill() }

        let store = try await HopStore.open(path: folder.database)
        let runs = try await Self.mixedRuns(in: store)
        // Late by the step back would be 5 min; 30 s leaves a loaded machine room (16 s was seen).
        try await Self.expectEachDeadlineEndsOnTime(
            runs, in: store, launched: launched, started: started, within: .seconds(40))
        #expect(second.stdout.contains("started 3"), "the daemon started again did not resume its runs")
    }

    /// A `--mixed 3` daemon (a step in process timing out after 10 s, a sleep of 10 s, a parked
    /// step timing out after 10 s) whose wall clock `clock` steps, once its runs wait ("started
    /// 3"); with what starts it again, and when it was launched and its runs had started. It is
    /// killed if its runs do not get there.
    private static func mixedDaemon(
        in folder: TemporaryDirectory, clock: ClockSkew.Stepper
    ) async throws -> (
        daemon: ChildProcess, arguments: [String], environment: [String: String], launched: ContinuousClock.Instant,
        started: ContinuousClock.Instant
    ) {
        let environment = try await clock.environment(in: folder).merging(["HOP_TEST_WORK_TIMEOUT": "10"]) { $1 }
        let arguments = ["--db", folder.database, "--mixed", "3", "--lease", "60"]
        let launched = ContinuousClock.now
        let daemon = try ChildProcess(
            "hop-test-daemon", arguments, environment: environment, keepInputOpen: true, directory: folder)
        try await daemon.killedIfFails { try await daemon.waitForOutput("started 3", timeout: .seconds(30)) }
        return (daemon, arguments, environment, launched, ContinuousClock.now)
    }

    /// The runs of `--mixed 3`: the step in process, the sleep, the parked step.
    private static func mixedRuns(in store: HopStore) async throws -> [RunRecord] {
        var runs: [RunRecord] = []
        for subject in ["mixed-0", "mixed-1", "mixed-2"] {
            runs.append(try #require(try await store.latestRun(flow: "mixed", subject: subject)))
        }
        return runs
    }

    /// Waits until each deadline of the `--mixed 3` runs has passed (within `timeout`), and
    /// checks that each passed 10 s after it began: not before the first daemon was
    /// `launched` + 9.5 s, and within 30 s of when its runs had `started`.
    private static func expectEachDeadlineEndsOnTime(
        _ runs: [RunRecord], in store: HopStore, launched: ContinuousClock.Instant, started: ContinuousClock.Instant,
        within timeout: Duration
    ) async throws {
        var ended: [String: ContinuousClock.Instant] = [:]
        try await waitUntil("every deadline passes", timeout: timeout) {
            for (what, run) in zip(
                ["the step in process timed out", "the sleep ended", "the parked step timed out"], runs)
            where ended[what] == nil {
                let history = try await store.history(runID: run.id)
                if history.contains(where: { $0.kind == .timeout || ($0.kind == .hop && $0.step == "done") }) {
                    ended[what] = ContinuousClock.now
                }
            }
            return ended.count == runs.count
        }
        for (what, at) in ended {
            #expect(at - launched >= .seconds(9.5), "\(what) \(at - launched) after the daemon was first launched")
            #expect(at - started <= .seconds(30), "\(what) \(at - started) after its runs started: late")
        }
    }

    /// A board without a real-time clock is restarted while its daemon's runs wait (a step in
    /// process with a timeout of 10 s, a durable sleep of 10 s, a parked step with a timeout of
    /// 10 s), and boots with its clock an hour behind (a saved time, restored), until NTP sets it
    /// right. Deadlines of an earlier boot go by the wall clock: each must end 10 s after it
    /// began, once the clock is right. Before, the step's timeout and the sleep, waited for in
    /// process, were measured once, by the clock as it stood when the daemon resumed them: they
    /// would have ended an hour late (only the parked step, which the engine's watch looks at
    /// every poll, ended on time).
    @Test func deadlinesOfAnEarlierBootEndOnTimeOnceNTPSetsAClockThatBootedBehind() async throws {
        let folder = try TemporaryDirectory()
        let clock = try ClockSkew.Stepper(in: folder)
        let (first, arguments, environment, launched, started) = try await Self.mixedDaemon(in: folder, clock: clock)
        defer { first.kill() }
        first.kill()
        try await first.waitForExit()
        // The restart: the leases and deadlines kept by the uptime clock are of an earlier boot now.
        let moved = try await run("hop-test-store", ["earlier-boot", folder.database], in: folder)
        #expect(moved.status == 0, "\(moved.stderr)")
        try clock.step(to: -3600)
        let store = try await HopStore.open(path: folder.database)
        let runs = try await Self.mixedRuns(in: store)
        let second = try ChildProcess(
            "hop-test-daemon", arguments, environment: environment, keepInputOpen: true, directory: folder)
        defer { second.kill() }
        // Once it waits again for the step's timeout and the sleep (told just before), NTP steps the clock.
        try await second.waitForOutput("napping", timeout: .seconds(30))
        try await waitUntil("the step in process is entered again", timeout: .seconds(30)) {
            bodyLines(in: folder).filter { $0 == "\(runs[0].id) work" }.count == 2
        }
        try clock.step(to: 0)
        // An hour late before; 30 s leaves a loaded machine room.
        try await Self.expectEachDeadlineEndsOnTime(
            runs, in: store, launched: launched, started: started, within: .seconds(60))
    }
}
