import Foundation
import HopStore
import HopTestSupport
import Testing

/// One executor per run, decided by liveness, never by the engine's label: tried the way an
/// operator does it, with real processes that share a label, are killed, restarted and frozen.
@Suite struct OwnershipProcessTests {
    @Test func aDaemonRestartedWithTheSameLabelAfterSIGKILLTakesEveryRunBackAtOnce() async throws {
        let folder = try TemporaryDirectory()
        // A lease far longer than the test: nothing here may wait for one to expire. Sleeps and
        // timeouts of 60 s, longer than the daemon may take to start all 51 runs (50 s): the
        // daemon is killed before any comes due. With 10 s, CI's busiest first minute once let
        // every one come due before the kill.
        let arguments = ["--db", folder.database, "--mixed", "51", "--engine-id", "kiosk", "--lease", "120"]
        let environment = ["HOP_TEST_MIXED_WAIT": "60"]
        let first = try ChildProcess(
            "hop-test-daemon", arguments, environment: environment, keepInputOpen: true, directory: folder)
        try await first.waitForOutput("started 51", timeout: .seconds(50))
        first.kill()
        try await first.waitForExit()

        let store = try await HopStore.open(path: folder.database)
        let inFlight = try await store.unfinishedRuns(status: .running, flows: ["mixed"])
        #expect(inFlight.count >= 17, "17 runs in a step, up to 17 in a durable sleep")
        let dead = Set(inFlight.compactMap(\.owner))
        // (A run whose timeout came just before the kill is running with no owner yet.)
        #expect(
            dead.count == 1 && inFlight.allSatisfy { $0.owner == nil || ($0.ownerLabel == "kiosk" && $0.leaseIsLive()) }
        )
        let parked = try await store.unfinishedRuns(status: .parked, flows: ["mixed"])
        #expect(inFlight.count + parked.count >= 34, "up to 17 parked with a timeout, unless it came before the kill")
        let unfinished = Set((inFlight + parked).map(\.id))

        let second = try ChildProcess(
            "hop-test-daemon", arguments, environment: environment, keepInputOpen: true, directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("ready", timeout: .seconds(30))
        // Ready means resumed: no run is held by the dead process any more, and every run in
        // its step (which cannot move on before the release) is held by the new one already.
        // (Sleeps and timeouts may come due meanwhile on a loaded machine, and move their runs on.)
        let resumed = try await store.unfinishedRuns(status: .running, flows: ["mixed"])
        // (Failed once, in a filtered run beside six fleets: what the look for dead engines had
        // to go by is said, should it fail again.)
        #expect(
            !resumed.contains { dead.contains($0.owner ?? "") },
            """
            \(resumed.count { dead.contains($0.owner ?? "") }) runs still held by \(dead); \
            the engines' folder: \((try? FileManager.default.contentsOfDirectory(atPath: folder.database + "-engines"))?.sorted() ?? []); \
            the second daemon: \(second.stdout.suffix(2_000)) \(second.stderr.suffix(2_000))
            """)
        let working = resumed.filter { Int($0.subject.dropFirst("mixed-".count)).map { $0 % 3 == 0 } == true }
        #expect(working.count == 17)
        for run in working {
            #expect(
                run.ownerLabel == "kiosk" && !dead.contains(run.owner ?? "") && run.leaseIsLive(),
                "run \(run.id): \(run.owner ?? "-")")
        }
        #expect(FileManager.default.createFile(atPath: folder.database + ".release", contents: nil))
        // The sleeps and timeouts come due 60 s after they began; the dead process's leases, 120 s.
        try await waitUntil("all 51 runs completed", timeout: .seconds(120)) {
            let running = try await store.unfinishedRuns(status: .running, flows: ["mixed"])
            let parked = try await store.unfinishedRuns(status: .parked, flows: ["mixed"])
            return running.isEmpty && parked.isEmpty
        }
        for index in 0..<51 {
            let run = try #require(try await store.latestRun(flow: "mixed", subject: "mixed-\(index)"))
            #expect(run.status == .completed, "run \(run.id) is \(run.status.rawValue)")
            let history = try await store.history(runID: run.id)
            #expect(!history.contains { [.error, .fail, .diverge].contains($0.kind) })
            // Every run unfinished at the kill changed hands once (a parked one when its timeout
            // came), and the history says to whom.
            let takeovers = history.filter { $0.kind == .takeover }
            #expect(takeovers.count == (unfinished.contains(run.id) ? 1 : 0), "run \(run.id): \(takeovers)")
            for takeover in takeovers {
                #expect(
                    takeover.step == "kiosk" && dead.contains { takeover.value?.contains($0) == true }, "\(takeover)")
            }
        }
        second.closeInput()
        #expect(try await second.waitForExit() == 0)
    }

    @Test(arguments: TestBackend.all)
    func aFrozenOwnerLosesItsRunOnlyWhenTheLeaseExpiresAndThenWritesNothing(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        // A: splash takes forever. B: the same label, a normal splash.
        let arguments = try await Self.twinArguments(backend, folder)
        let owner = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SLOW_SPLASH": "1"], directory: folder)
        defer {
            owner.kill(SIGCONT)
            owner.kill()
        }
        try await owner.waitForOutput("point after:hop:splash")
        let other = try ChildProcess("hop-test-daemon", arguments, directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        #expect(
            !other.stdout.contains("executing run 1"),
            "B executed a run A holds, though A is alive and holds it under the same label")

        let store = try await backend.open(folder)
        // A's lease as it stood before the freeze's tries: on a loaded machine the tries (each
        // freezes A until it holds no lock) can add up past A's lease, and B then takes the run
        // over before the freeze that holds, once that lease expired. Once, in the full suite,
        // the run read after the freeze was already B's, and its lease B's.
        let before = try #require(try await store.run(id: 1))
        let leaseBefore = try #require(before.leaseExpiresAt, "A holds the run: A: \(owner.stdout) B: \(other.stdout)")
        try await Self.freeze(owner, outsideItsTransactionsOn: backend, folder)
        let held = try #require(try await store.run(id: 1))
        // A's lease when it froze, if it still held the run; else the one it had before.
        let expiry =
            held.owner == before.owner
            ? try #require(
                held.leaseExpiresAt, "A held the run until the freeze: A: \(owner.stdout) B: \(other.stdout)")
            : leaseBefore
        do {
            try await other.waitForOutput("parked onboarding", timeout: .seconds(30))
        } catch {
            let lock =
                backend.name == TestBackend.postgres.name ? "" : " write lock free: \(writeLockIsFree(folder.database))"
            throw TestFailure("\(error);\(lock)\nA: \(owner.stdout)\(owner.stderr)\nB: \(other.stdout)\(other.stderr)")
        }
        let history = try await store.history(runID: 1)
        let takeover = try #require(history.first { $0.kind == .takeover })
        #expect(takeover.at >= expiry, "taken over \(expiry.timeIntervalSince(takeover.at)) s before the lease expired")
        #expect(takeover.value?.contains(before.owner ?? "?") == true, "\(takeover)")

        owner.kill(SIGCONT)
        try await waitUntil("the thawed owner stops its step") {
            bodyLines(in: folder).contains("1 splash-cancelled")
        }
        // The thawed owner wrote nothing: the history is as B left it, and B still leads the run.
        #expect(try await store.history(runID: 1) == history)
        try await Self.finishOnboardingAndLogin(of: store, on: backend, folder, owner: owner, other: other)
        #expect(other.stdout.contains("settled completed"))

        let final = try await store.history(runID: 1)
        #expect(final.filter { $0.kind == .hop }.map { $0.step ?? "" } == ["splash", "onboarding", "login", "main"])
        // Once the owner is thawed, either engine may execute the run after an unhop: a clean change of hands.
        #expect(final.filter { $0.kind == .takeover }.first == takeover)
        #expect(!final.contains { [.error, .fail, .diverge].contains($0.kind) })
        #expect(final.filter { $0.kind == .effect }.count == 1)
    }

    /// Another process holds the file's write lock for longer than a lease (an operator's
    /// `sqlite3` session, a `VACUUM`), three times over. Every engine waits for the lock
    /// meanwhile: the owner cannot renew its lease, and the other engine, finding the lease
    /// expired, waits to claim the run. The owner is alive and not frozen: it keeps its run, and
    /// its step is never entered again nor cancelled, with either `lapsedLeases` (an owner that
    /// stops executing a run whose lease it could not renew does not stop it while its heartbeat
    /// says that it waits for the lock).
    ///
    /// The first two holds end while both engines still wait, 4 s into their 5 s busy timeout:
    /// whichever writes first once it ends, the other engine must not take the run. Before, it
    /// took it at the first hold, in 3 runs of 3. The third lasts 7 s, longer than the busy
    /// timeout: the owner's renewal fails busy and is tried again, and its heartbeat must hold
    /// across. With `--stop-on-lapse` the owner's splash was cancelled and entered again at every
    /// hold, while its lease renewals were paced from their answers: a renewal that waited
    /// through the hold was followed a third of a lease later, after its heartbeat stopped
    /// shielding the run. (That case was an in-process test before, whose 2 s lease hid it, and
    /// which a loaded test process starved past its lease.)
    @Test(arguments: [false, true])
    func aLiveOwnerKeepsItsRunWhileAnotherProcessHoldsTheWriteLockPastItsLease(stopOnLapse: Bool) async throws {
        let folder = try TemporaryDirectory()
        let arguments = try await Self.twinArguments(.sqlite, folder) + (stopOnLapse ? ["--stop-on-lapse"] : [])
        let owner = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SLOW_SPLASH": "1"], directory: folder)
        defer { owner.kill() }
        try await owner.waitForOutput("point after:hop:splash")
        let other = try ChildProcess("hop-test-daemon", arguments, directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        let store = try await TestBackend.sqlite.open(folder)
        let held = try #require(try await store.run(id: 1)?.owner, "A holds the run: \(owner.stdout)")

        for (hold, seconds) in [4, 4, 7].enumerated() {
            let released = try await holdingTheWriteLock(of: folder.database) {
                // How long the lock is held (past the 3 s lease), not a wait for an outcome.
                try await Task.sleep(for: .seconds(seconds))
                return Date()
            }
            try await waitUntil("the owner renewed its lease, or lost its run (hold \(hold + 1))") {
                let run = try await store.run(id: 1)
                return run?.owner != held || (run?.leaseExpiresAt ?? .distantPast) > released
            }
            let history = try await store.history(runID: 1)
            #expect(
                try await store.run(id: 1)?.owner == held,
                "hold \(hold + 1): the run changed hands: \(history)\nA: \(owner.stdout)\nB: \(other.stdout)")
            #expect(!history.contains { $0.kind == .takeover }, "hold \(hold + 1): \(history)")
            #expect(bodyLines(in: folder) == ["1 splash"], "hold \(hold + 1): \(owner.stdout)")
        }
    }

    /// An engine takes over a run whose owner froze, and its claim waits for the file's write
    /// lock, which another process holds for longer than a lease. The claim's lease counts from
    /// when it was asked for, and may be all but over when the claim is answered: the engine must
    /// renew it at once, before its heartbeat (written while it waited) stops shielding the run.
    /// Before, with `--stop-on-lapse`, a renewal that waited beside the claim and read the runs to
    /// renew before the claim was answered was followed only a third of a lease later, and the
    /// new owner stopped its step a second after the hold and entered it again: 3 runs of 3.
    ///
    /// A 6 s lease, and a 30 s busy timeout so that the claim waits through the hold: the
    /// engine's looks for expired leases come every 2 s, so its claim is asked within 2.2 s of
    /// A's lease's end, and the hold lasts until 8 s after it; the claim waits more than the 5.4 s
    /// the engine takes a lease as kept, and its heartbeat shields the run for about a second
    /// after the hold, a second before the next renewal was due.
    @Test func aRunClaimedWhileAnotherProcessHeldTheWriteLockPastItsLeaseIsRenewedBeforeItLapses() async throws {
        let folder = try TemporaryDirectory()
        let arguments = [
            "--db", folder.database, "--files", folder.database, "--external", "--engine-id", "twin", "--lease", "6",
            "--busy-timeout", "30", "--stop-on-lapse",
        ]
        let owner = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SLOW_SPLASH": "1"], directory: folder)
        defer {
            owner.kill(SIGCONT)
            owner.kill()
        }
        try await owner.waitForOutput("point after:hop:splash")
        let other = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SLOW_SPLASH": "1"], directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        let store = try await TestBackend.sqlite.open(folder)
        try await HopStoreTestSupport.freeze(owner, betweenCommitsOn: folder.database)
        let frozen = try #require(try await store.run(id: 1), "A holds the run: \(owner.stdout)")
        let expiry = try #require(frozen.leaseExpiresAt, "A holds the run: \(owner.stdout)")
        #expect(!other.stdout.contains("executing run 1"), "B took the run before the hold: \(other.stdout)")
        try #require(expiry.timeIntervalSinceNow > 0.5, "the hold begins before A's lease ends")

        let released = try await holdingTheWriteLock(of: folder.database) {
            // How long the lock is held (past A's lease's end, by more than B's), not a wait for an outcome.
            try await Task.sleep(for: .seconds(expiry.addingTimeInterval(8).timeIntervalSinceNow))
            return Date()
        }
        // B's renewals after the hold: the second is asked at least a third of a lease after the
        // first, past the end of the shield of its heartbeat, when a lapsed lease was stopped.
        try await waitUntil("B renewed its lease on the run past the end of its heartbeat", timeout: .seconds(30)) {
            (try await store.run(id: 1)?.leaseExpiresAt ?? .distantPast) > released.addingTimeInterval(7.5)
        }
        let history = try await store.history(runID: 1)
        #expect(history.map(\.kind) == [.hop, .takeover], "\(history)")
        #expect(
            bodyLines(in: folder) == ["1 splash", "1 splash"], "A's splash, then B's, once\nB: \(other.stdout)")
        #expect(
            other.stdout.components(separatedBy: "executing run 1 ").count == 2,
            "B executed the run once: \(other.stdout)")
    }

    /// A step's unhop is held in memory until the run's next record (or a few milliseconds),
    /// so an owner can be frozen after its step unhopped and before the unhop is durable. The
    /// run goes to the engine that takes it over, which enters the step again (at least once),
    /// with the same token. The thawed owner's step then returns, and the owner writes its held
    /// unhop with the next hop while the new owner's step is still running: the write is
    /// refused (the run is held by another engine), and the step's end is recorded once.
    @Test(arguments: TestBackend.all)
    func aFrozenOwnersHeldUnhopIsNeverWrittenOnceItsRunChangedHands(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let arguments = try await Self.twinArguments(backend, folder)
        // A's splash unhops, then runs on until A's input closes; the unhop stays held meanwhile.
        let owner = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SPLASH_RUNS_ON": "1"], keepInputOpen: true,
            directory: folder)
        defer {
            owner.kill(SIGCONT)
            owner.kill()
        }
        try await waitUntil("A's splash unhopped and runs on", timeout: .seconds(30)) {
            bodyLines(in: folder).contains("1 splash-unhopped")
        }
        // B's splash waits until B's input closes.
        let other = try ChildProcess(
            "hop-test-daemon", arguments, environment: ["HOP_TEST_SPLASH_WAITS": "1"], keepInputOpen: true,
            directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        try await Self.freeze(owner, outsideItsTransactionsOn: backend, folder)
        let store = try await backend.open(folder)
        // Frozen with its unhop held: nothing of the step's end is in the database. B may have
        // taken the run over already: on a loaded machine, the freeze can come late in A's lease,
        // and this read later still. (Once, in the full suite, the history read here was not
        // the hop alone; it was not printed then, and is now.)
        let frozen = try await store.history(runID: 1)
        #expect(frozen.first?.kind == .hop && frozen.dropFirst().allSatisfy { $0.kind == .takeover }, "\(frozen)")
        try await waitUntil("B took the run over and entered splash again", timeout: .seconds(30)) {
            bodyLines(in: folder).filter { $0 == "1 splash" }.count == 2
        }
        let history = try await store.history(runID: 1)
        #expect(history.map(\.kind) == [.hop, .takeover], "\(history)")

        // Thawed, A finds its input closed: its step returns at once, and A writes the held unhop
        // with the run's next record (its first-use decision), unless its watch learns first that
        // the run changed hands (then the step is cancelled). Either way, nothing of A's is
        // written.
        owner.closeInput()
        owner.kill(SIGCONT)
        try await waitUntil("the thawed owner's step ends") {
            let lines = bodyLines(in: folder)
            return lines.contains("1 splash-ran-on")
                || (lines.contains("1 splash-returned")
                    && owner.stdout.contains("point before:decision:isFirstUse(onboarding)"))
        }
        #expect(try await store.history(runID: 1) == history, "\(owner.stdout)")

        other.closeInput()
        try await other.waitForOutput("parked onboarding")
        try await Self.finishOnboardingAndLogin(of: store, on: backend, folder, owner: owner, other: other)
        let final = try await store.history(runID: 1)
        let unhops = final.filter { $0.kind == .unhop }
        #expect(unhops.map(\.step) == ["splash", "onboarding", "login", "main"], "\(final)")
        #expect(unhops.first?.value?.contains("warm") == true, "B's unhop of splash, not A's: \(final)")
        #expect(final.first { $0.kind == .takeover } == history.last, "\(final)")
        #expect(!final.contains { [.error, .fail, .diverge].contains($0.kind) }, "\(final)")
    }

    /// Finishes run 1, parked at onboarding, from outside (`hopctl unhop`, then `hopctl session
    /// login`), and waits for both daemons to exit with it. Parked, the run is held by no engine:
    /// either daemon may carry it on after each unhop.
    private static func finishOnboardingAndLogin(
        of store: any HopAdministration, on backend: TestBackend, _ folder: TemporaryDirectory, owner: ChildProcess,
        other: ChildProcess
    ) async throws {
        let database = try await backend.location(folder)
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", database], in: folder
            )
            .status == 0)
        try await waitUntil("the run waits at login") {
            let run = try await store.run(id: 1)
            return run?.status == .parked && run?.currentStep == "login"
        }
        #expect(try await run("hopctl", ["session", "login", "alice", "--db", database], in: folder).status == 0)
        #expect(try await other.waitForExit() == 0)
        #expect(try await owner.waitForExit() == 0, "the thawed owner follows the run to its end")
    }

    /// The arguments of the twin daemons of the frozen-owner tests: the same label, external
    /// steps, their step bodies noted in the test's folder whatever the backend. The lease is
    /// short, so that the test waits little for it to expire, but renewed often enough that the
    /// owner keeps it until the test freezes it, on a machine loaded by the whole suite: 3 s on
    /// SQLite (renewed every second); 12 s on PostgreSQL, where a server shared by the suite's
    /// tests once delayed an owner's renewals past 3 s, and later past 8 s, with the clock tests'
    /// daemons running beside (its run was taken over before the freeze).
    private static func twinArguments(_ backend: TestBackend, _ folder: TemporaryDirectory) async throws -> [String] {
        [
            "--db", try await backend.location(folder), "--files", folder.database, "--external", "--engine-id", "twin",
            "--lease", backend.name == TestBackend.postgres.name ? "12" : "3",
        ]
    }

    /// Freezes `process` (SIGSTOP) at a moment it holds no lock another engine would wait for to
    /// take run 1 over: SQLite's write lock on the file (``freeze(_:betweenCommitsOn:)``), or on
    /// PostgreSQL the row of run 1, locked by a transaction of its (a lease renewal, a record).
    /// (Any open transaction is too wide a test there: the other engine's polls keep one open
    /// often enough that, on a loaded machine, the freezes tried meanwhile starved the owner
    /// past its lease before one was kept.)
    static func freeze(
        _ process: ChildProcess, outsideItsTransactionsOn backend: TestBackend, _ folder: TemporaryDirectory
    ) async throws {
        guard backend.name == TestBackend.postgres.name else {
            return try await HopStoreTestSupport.freeze(process, betweenCommitsOn: folder.database)
        }
        try await freeze(pid: process.processIdentifier, withoutALockOnRun1In: folder)
    }

    /// Freezes process `pid` (SIGSTOP) at a moment no transaction of its holds the row of run 1
    /// in the PostgreSQL database of the test whose folder is `folder`.
    static func freeze(pid: pid_t, withoutALockOnRun1In folder: TemporaryDirectory) async throws {
        try await waitUntil("the process is frozen without a lock on run 1", timeout: .seconds(30)) {
            try await stopEveryThread(of: pid)
            do {
                try await TestDatabases.shared.psql("SELECT id FROM runs WHERE id = 1 FOR UPDATE NOWAIT", in: folder)
                return true
            } catch {
                kill(pid, SIGCONT)
                return false
            }
        }
    }

    @Test func twinDaemonsWithTheSameLabelNeverExecuteARunTwice() async throws {
        // Two copies of the example daemon (the same label, hop-demo@host) started together on a
        // fresh database, 20 times, four databases at a time.
        for batch in 0..<5 {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for attempt in 0..<4 {
                    group.addTask { try await Self.twinStart(attempt: batch * 4 + attempt) }
                }
                try await group.waitForAll()
            }
        }
    }

    private static func twinStart(attempt: Int) async throws {
        let folder = try TemporaryDirectory()
        let twins = try (0..<2).map { _ in
            try ChildProcess("hop-demo", ["--auto", "--db", folder.database], directory: folder)
        }
        defer { for twin in twins { twin.kill() } }
        for twin in twins {
            let status = try await twin.waitForExit(timeout: .seconds(30))
            #expect(status == 0, "attempt \(attempt): \(twin.stdout)\(twin.stderr)")
            #expect(twin.stdout.contains("run 1 is completed"), "attempt \(attempt): \(twin.stdout)\(twin.stderr)")
        }
        let store = try await HopStore.open(path: folder.database)
        #expect(
            try await store.allRuns(flow: "startup", subject: "default").map(\.status) == [.completed],
            "attempt \(attempt)")
        let history = try await store.history(runID: 1)
        let kinds = history.map { "\($0.kind.rawValue) \($0.step ?? "")" }
        #expect(
            history.filter { $0.kind == .hop }.map { $0.step ?? "" } == ["splash", "onboarding", "login", "main"],
            "attempt \(attempt): \(kinds)")
        #expect(history.filter { $0.kind == .effect }.count == 1, "attempt \(attempt): markUsed once: \(kinds)")
        #expect(!history.contains { [.error, .fail, .diverge].contains($0.kind) }, "attempt \(attempt): \(kinds)")
    }
}
