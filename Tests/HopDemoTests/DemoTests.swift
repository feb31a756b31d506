import Foundation
import HopStore
import HopTestSupport
import Testing

/// The README's tour, run against the built `hop-demo` and `hopctl`.
@Suite struct DemoTests {
    @Test func autoRunsTwiceTheSecondSkipsOnboardingAndLoginUntilFirstUseIsReset() async throws {
        let folder = try TemporaryDirectory()
        let first = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(first.status == 0, "\(first.stderr)")
        for line in [
            "hop    -> splash", "first use of onboarding: yes", "hop    -> onboarding", "stored session: none",
            "hop    -> login", "hop    -> main", "run 1 is completed",
        ] {
            #expect(first.stdout.contains(line), "first run lacks \"\(line)\":\n\(first.stdout)")
        }

        let second = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(second.status == 0)
        #expect(
            second.stdout.contains("first use of onboarding: no") && second.stdout.contains("stored session: alice"))
        #expect(!second.stdout.contains("-> onboarding") && !second.stdout.contains("-> login"))
        #expect(second.stdout.contains("hop    -> main") && second.stdout.contains("run 2 is completed"))

        let reset = try await run("hopctl", ["reset-first-use", "onboarding", "--db", folder.database], in: folder)
        #expect(reset.status == 0)
        let third = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(third.stdout.contains("hop    -> onboarding") && !third.stdout.contains("-> login"))

        let logout = try await run("hopctl", ["session", "logout", "--db", folder.database], in: folder)
        #expect(logout.status == 0)
        let fourth = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(!fourth.stdout.contains("-> onboarding") && fourth.stdout.contains("hop    -> login"))
    }

    /// Its standard output closed (a journal restarted, a pipe's reader gone), the daemon goes on
    /// without its narration, whether SIGPIPE is ignored (as systemd does) or not, with and
    /// without the metrics server.
    @Test(arguments: [(false, false), (true, false), (false, true)])
    func aDaemonWhoseStandardOutputClosesFinishesItsRun(ignoreSIGPIPE: Bool, metrics: Bool) async throws {
        let folder = try TemporaryDirectory()
        let demo =
            [builtProduct("hop-demo"), "--auto", "--db", folder.database] + (metrics ? ["--metrics-port", "0"] : [])
        // The reader takes the first byte and goes; every later line meets a closed pipe.
        let script =
            (ignoreSIGPIPE ? "trap '' PIPE; " : "")
            + "\(demo.map { "'\($0)'" }.joined(separator: " ")) 2>\(folder.path("stderr")) | head -c 1 >/dev/null; "
            + "echo \"demo ${PIPESTATUS[0]}\""
        let result = try await run("/bin/bash", ["-c", script], in: folder)
        let stderr = (try? String(contentsOfFile: folder.path("stderr"), encoding: .utf8)) ?? ""
        #expect(result.stdout.contains("demo 0"), "\(result.stdout)\(stderr)")
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.latestRun(flow: "startup", subject: "default")?.status == .completed, "\(stderr)")
    }

    /// A subject that is no name is a usage error, refused before the database is created.
    @Test func aSubjectThatIsNoNameIsRefusedBeforeTheDatabaseIsCreated() async throws {
        let folder = try TemporaryDirectory()
        for subject in ["", "a\u{202E}b"] {
            let bad = try await run("hop-demo", ["--db", folder.database, "--subject", subject], in: folder)
            #expect(
                bad.status == 64 && bad.stderr.contains("--subject: the subject is not a valid identifier"),
                "\(bad.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: folder.database), "a refused command created the database")
    }

    @Test func killedWhileWaitingOnOnboardingItResumesThereWithoutShowingSplashAgain() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        try await first.waitForOutput("run `hopctl --db \(folder.database) unhop --flow startup --step onboarding`")
        first.kill(SIGKILL)
        try await first.waitForExit()

        let second = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("resuming run 1 of startup for default at onboarding")
        try await second.waitForOutput("parked at onboarding")
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        try await second.waitForOutput("run `hopctl --db \(folder.database) session login alice`")
        #expect(
            try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        try await second.waitForOutput("run 1 is completed")
        #expect(try await second.waitForExit() == 0)
        #expect(!second.stdout.contains("splash"), "splash was shown again:\n\(second.stdout)")
    }

    @Test func sigtermStopsCleanlyAndTheRunStaysResumable() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        try await demo.waitForOutput("parked at onboarding")
        demo.kill(SIGTERM)
        #expect(try await demo.waitForExit() == 0)
        #expect(!demo.wasSignalled)
        #expect(demo.stdout.contains("stays resumable at onboarding"))
        let store = try await HopStore.open(path: folder.database)
        let runRecord = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        #expect(runRecord.status == .parked && runRecord.currentStep == "onboarding")
    }
}

/// An operator restores a backup (`hopctl backup`, then the copy put in the database's place, as
/// the README says) without stopping the daemon first. The daemon still has the file it opened,
/// which no other process sees any more: before, it went on there (SQLite says nothing in WAL
/// mode), and what it and `hopctl` did from then on went to two different files. It stops within
/// a poll, exits 1 saying why and what to do, and started again resumes from the backup.
@Suite struct DemoDatabaseReplacedTests {
    @Test func aBackupPutInPlaceUnderARunningDaemonStopsItAndItResumesFromTheBackup() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        let copy = folder.path("backup.sqlite")
        let backup = try await run("hopctl", ["backup", copy, "--db", folder.database], in: folder)
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        try await demo.waitForOutput("parked at login")

        for suffix in ["-wal", "-shm"] { unlink(folder.database + suffix) }
        #expect(rename(copy, folder.database) == 0)
        let status = try await demo.waitForExit(timeout: .seconds(30))
        #expect(status == 1, "\(demo.stdout)\(demo.stderr)")
        let said = demo.stdout + demo.stderr
        #expect(said.contains("the database file was removed or replaced while this process had it open"), "\(said)")
        #expect(said.contains("Start the process again"), "\(said)")

        let again = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { again.kill() }
        try await again.waitForOutput("resuming run 1 of startup for default at onboarding")
        try await again.waitForOutput("parked at onboarding")
    }

    /// PostgreSQL's counterpart: a `pg_dump` restored while the daemon runs, with
    /// `pg_restore --clean` (the server keeps the daemon's connections) or into the database
    /// dropped with `WITH (FORCE)` and created again (the daemon connects again). Either way its
    /// statements find the tables the restore made: before, it went on with its run as it knew
    /// it, over the restored one. It stops within a third of a lease (its look at the schema:
    /// 3.3 s with the demo's lease), exits 1 saying why and what to do, and started again
    /// resumes from the backup.
    @Test(.enabled(if: TestBackend.all.contains { $0.name == "postgres" }), arguments: [false, true])
    func aBackupRestoredUnderARunningDaemonOnPostgreSQLStopsItAndItResumesFromTheBackup(recreating: Bool) async throws {
        let folder = try TemporaryDirectory()
        let database = try await TestBackend.postgres.location(folder)
        let demo = try ChildProcess("hop-demo", ["--db", database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        let backup = try await TestDatabases.shared.dump(in: folder)
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", database], in: folder
            )
            .status == 0)
        try await demo.waitForOutput("parked at login")

        try await TestDatabases.shared.restore(backup, in: folder, recreating: recreating)
        let status = try await demo.waitForExit(timeout: .seconds(60))
        #expect(status == 1, "\(demo.stdout)\(demo.stderr)")
        let said = demo.stdout + demo.stderr
        #expect(said.contains("Hop's tables in the database were dropped and created again"), "\(said)")
        #expect(said.contains("Start the process again"), "\(said)")

        let again = try ChildProcess("hop-demo", ["--db", database], directory: folder)
        defer { again.kill() }
        try await again.waitForOutput("resuming run 1 of startup for default at onboarding")
        try await again.waitForOutput("parked at onboarding")
    }
}

/// An operator upgrades Hop by running the newer release's `hopctl migrate` (or starting a newer
/// daemon beside the old one) before stopping the old daemon. Before, the old daemon went on
/// writing with its code into a schema it does not know, beside the newer release. It stops
/// within a third of a lease (3.3 s with the demo's 10 s), exits 1 saying a newer Hop upgraded
/// the database and to start the newer release, and leaves its run to it; started again, the
/// old binary refuses the database, as it always did.
@Suite struct DemoSchemaUpgradedTests {
    @Test(arguments: TestBackend.all)
    func aNewerHopUpgradingTheDatabaseUnderARunningDaemonStopsIt(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.location(folder)
        let demo = try ChildProcess("hop-demo", ["--db", database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        if backend.name == "postgres" {
            try await TestDatabases.shared.psql(
                """
                CREATE TABLE later (id integer);
                INSERT INTO hop_migrations (version, name, checksum, applied_at)
                    SELECT max(version) + 1, 'later', 'x', 0 FROM hop_migrations
                """, in: folder)
        } else {
            let newer = try await run("hop-test-store", ["migrate-newer", database], in: folder)
            #expect(newer.status == 0, "\(newer.stderr)")
        }
        let status = try await demo.waitForExit(timeout: .seconds(30))
        #expect(status == 1, "\(demo.stdout)\(demo.stderr)")
        let said = demo.stdout + demo.stderr
        #expect(said.contains("a newer Hop upgraded the database to schema version"), "\(said)")
        #expect(said.contains("Start the newer release in its place"), "\(said)")

        let again = try await run("hop-demo", ["--db", database], in: folder)
        #expect(again.status == 1 && again.stderr.contains("written by a newer Hop"), "\(again.stderr)")
    }
}

/// hop-demo follows its run whatever another process does to it, and its exit status says how it ended.
@Suite struct DemoFollowsItsRunTests {
    @Test func aRunCancelledByHopctlIsReportedAndTheDemoExitsZero() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        #expect(
            try await run("hopctl", ["cancel", "--flow", "startup", "--db", folder.database], in: folder).status == 0)
        #expect(try await demo.waitForExit(timeout: .seconds(30)) == 0, "\(demo.stdout)\(demo.stderr)")
        #expect(demo.stdout.contains("run 1 is cancelled"), "\(demo.stdout)")
    }

    @Test func aRunRestartedByHopctlIsFollowedToTheNewRun() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        #expect(
            try await run("hopctl", ["restart", "--flow", "startup", "--db", folder.database], in: folder).status == 0)
        try await demo.waitForOutput(
            "run 1 was restarted by another process as run 2: following it", timeout: .seconds(30))
        let store = try await HopStore.open(path: folder.database)
        try await waitUntil("the daemon executes run 2 to onboarding", timeout: .seconds(30)) {
            try await store.run(id: 2)?.status == .parked
        }
        // Run 2 is told from its first hop, though that came before the demo noticed the restart.
        let told = { String(demo.stdout.split(separator: "following it\n", maxSplits: 1).dropFirst().first ?? "") }
        try await waitUntil("hop-demo tells run 2 parked", timeout: .seconds(30)) {
            told().contains("parked at onboarding")
        }
        #expect(told().contains("hop    -> splash") && told().contains("unhop  <- splash"), "\(demo.stdout)")
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        #expect(
            try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        #expect(try await demo.waitForExit(timeout: .seconds(30)) == 0, "\(demo.stdout)\(demo.stderr)")
        #expect(demo.stdout.contains("run 2 is completed"), "\(demo.stdout)")
    }

    /// Two copies of the demo on the database in `folder`: the first parked at onboarding, the
    /// second resuming that run beside it. Both are killed if the second does not get there.
    private static func twoCopiesAtOnboarding(
        in folder: TemporaryDirectory
    ) async throws -> (first: ChildProcess, second: ChildProcess) {
        let first = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        return try await first.killedIfFails {
            try await first.waitForOutput("parked at onboarding")
            let second = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
            try await second.killedIfFails {
                try await second.waitForOutput("resuming run 1 of startup for default at onboarding")
            }
            return (first, second)
        }
    }

    @Test func aRunFinishedByAnotherDaemonIsReportedAndBothExitZero() async throws {
        let folder = try TemporaryDirectory()
        // A second copy on the same database waits beside the first; then the first is stopped,
        // and the second finishes the run when an operator unhops it.
        let (first, second) = try await Self.twoCopiesAtOnboarding(in: folder)
        defer {
            first.kill()
            second.kill()
        }
        try await freeze(first, betweenCommitsOn: folder.database)
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        #expect(
            try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        #expect(try await second.waitForExit(timeout: .seconds(30)) == 0, "\(second.stdout)\(second.stderr)")
        first.kill(SIGCONT)
        #expect(try await first.waitForExit(timeout: .seconds(30)) == 0, "\(first.stdout)\(first.stderr)")
        for demo in [first, second] { #expect(demo.stdout.contains("run 1 is completed"), "\(demo.stdout)") }
        // The first tells what the second did, once, in order.
        #expect(first.stdout.components(separatedBy: "hop    -> main").count == 2, "\(first.stdout)")
    }

    /// Two copies on one database: whichever executes the run, each tells it as it goes, and
    /// says what finishes the step it parks on next. Before, the copy that did not execute it
    /// went on saying that the run waited at onboarding, and what to type to finish it, while
    /// the run waited at login; it told the rest only once the run had ended.
    @Test func aRunMovedOnByAnotherDaemonIsToldAsItGoes() async throws {
        let folder = try TemporaryDirectory()
        let (first, second) = try await Self.twoCopiesAtOnboarding(in: folder)
        defer {
            first.kill()
            second.kill()
        }
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        for demo in [first, second] { try await demo.waitForOutput("waiting for a login") }
        #expect(
            try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        for demo in [first, second] {
            #expect(try await demo.waitForExit(timeout: .seconds(30)) == 0, "\(demo.stdout)\(demo.stderr)")
            // Each line once, in the run's order.
            let told = [
                "onboarding finished: run 1 continues", "hop    -> login", "parked at login",
                "login finished: run 1 continues",
                "hop    -> main", "run 1 is completed",
            ]
            let at = told.map { line in demo.stdout.range(of: line)?.lowerBound }
            #expect(
                at.allSatisfy { $0 != nil }
                    && at == at.sorted { ($0 ?? demo.stdout.endIndex) < ($1 ?? demo.stdout.endIndex) }, "\(demo.stdout)"
            )
            for line in told {
                #expect(demo.stdout.components(separatedBy: line).count == 2, "\(line): \(demo.stdout)")
            }
        }
    }

    @Test func aRunThatFailsEndsTheDemoWithANonZeroStatus() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")
        // A history that the flow code does not match (as if another version had recorded it):
        // when the run moves on, it diverges.
        let rename = try await run(
            "hop-test-store", ["set-history-step", folder.database, "1", "1", "intro"], in: folder)
        #expect(rename.status == 0, "\(rename.stderr)")
        #expect(
            try await run(
                "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder
            ).status == 0)
        #expect(try await demo.waitForExit(timeout: .seconds(30)) == 1, "\(demo.stdout)\(demo.stderr)")
        #expect(demo.stdout.contains("run 1 is diverged"), "\(demo.stdout)")
    }
}
