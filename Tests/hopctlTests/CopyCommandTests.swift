import Foundation
import HopStore
import HopTestSupport
import Testing

@Suite struct CopyCommandTests {
    /// What hopctl shows of a database: every run's status line and every run's history, as JSON.
    private func shown(_ db: String, in folder: TemporaryDirectory) async throws -> [String] {
        let status = try await hopctl(["status", "--json"], in: folder, db: db)
        #expect(status.status == 0, "\(status.stderr)")
        let history = try await hopctl(["history", "--flow", "startup", "--all-runs", "--json"], in: folder, db: db)
        #expect(history.status == 0, "\(history.stderr)")
        let flags = try await hopctl(["first-use", "list", "--json"], in: folder, db: db)
        return [status.stdout, history.stdout, flags.stdout]
    }

    /// A deployment moved from a file to `backend` and back: a run parked on a step, a completed
    /// run, a stored session, first-use flags; the copy shows the same in hopctl, and a daemon on
    /// the copy moves the parked run on.
    @Test(arguments: TestBackend.all)
    func copyMovesADeploymentToAnotherDatabaseAndBack(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let source = folder.database
        try await completedStartup(folder)
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", source, "--external", "--subject", "kiosk-1"], directory: folder)
        try await daemon.waitForOutput("parked onboarding")
        daemon.kill()
        _ = try await daemon.waitForExit()
        #expect(
            try await hopctl(
                ["session", "login", "carol", "--subject", "kiosk-2", "--token-stdin"], in: folder,
                stdin: "secret-token-of-carol\n"
            ).status == 0)
        let before = try await shown(source, in: folder)

        let middleFolder = try TemporaryDirectory()
        let middle = try await backend.location(middleFolder)
        let copy = try await run("hopctl", ["copy", "--from", source, "--to", middle], in: folder)
        #expect(copy.status == 0, "\(copy.stderr)")
        #expect(copy.stdout.contains("copied "), "\(copy.stdout)")
        #expect(!copy.stdout.contains("secret-token-of-carol") && !copy.stderr.contains("secret-token-of-carol"))
        #expect(try await shown(middle, in: folder) == before)
        let moved = try await backend.open(middleFolder)
        #expect(try await moved.session(subject: "kiosk-2")?.token == "secret-token-of-carol")

        // Into a database that holds data: refused, nothing changed.
        let again = try await run("hopctl", ["copy", "--from", source, "--to", middle], in: folder)
        #expect(again.status == 1 && again.stderr.contains("not empty"), "\(again.stderr)")
        #expect(try await shown(middle, in: folder) == before)

        // The parked run goes on on the copy; a new run gets an id never used.
        let resumed = try ChildProcess(
            "hop-test-daemon", ["--db", middle, "--external", "--subject", "kiosk-1"], directory: folder)
        defer { resumed.kill() }
        let unhop = try await hopctl(
            ["unhop", "--flow", "startup", "--subject", "kiosk-1", "--step", "onboarding"], in: folder, db: middle)
        #expect(unhop.status == 0, "\(unhop.stderr)")
        try await resumed.waitForOutput("parked login")
        #expect(
            try await hopctl(["session", "login", "dave", "--subject", "kiosk-1"], in: folder, db: middle).status == 0)
        try await resumed.waitForOutput("settled completed")
        let started = try await hopctl(["start", "--flow", "startup", "--subject", "kiosk-9"], in: folder, db: middle)
        #expect(started.status == 0 && started.stdout.contains("started run 3"), "\(started.stdout)\(started.stderr)")
        resumed.kill()

        // And back into a new file.
        let back = folder.path("back.sqlite")
        let copyBack = try await run("hopctl", ["copy", "--from", middle, "--to", back, "--json"], in: folder)
        #expect(copyBack.status == 0, "\(copyBack.stderr)")
        let report = try #require(try JSONSerialization.jsonObject(with: Data(copyBack.stdout.utf8)) as? [String: Any])
        #expect(report["runs"] as? Int == 3 && (report["sessions"] as? Int ?? 0) >= 2, "\(report)")
        #expect(try await shown(back, in: folder) == (try await shown(middle, in: folder)))
    }

    @Test func copyRefusesBadInputAndChangesNothing() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let same = try await run("hopctl", ["copy", "--from", folder.database, "--to", folder.database], in: folder)
        #expect(same.status == 64 && same.stderr.contains("same database"), "\(same.stderr)")
        let missing = try await run(
            "hopctl", ["copy", "--from", folder.path("none.sqlite"), "--to", folder.path("new.sqlite")], in: folder)
        #expect(missing.status == 1, "\(missing.stderr)")
        #expect(!FileManager.default.fileExists(atPath: folder.path("new.sqlite")))
        let badURL = try await run(
            "hopctl", ["copy", "--from", folder.database, "--to", "postgres://u:hunter2@/db?sslmode=bogus"], in: folder)
        #expect(badURL.status == 1 && !badURL.stderr.contains("hunter2"), "\(badURL.stderr)")
    }

    /// `hopctl copy` holds a page of what it moves at a time, whichever way it goes (a file to a
    /// file, to a server and back): a deployment of any size moves in the memory of a few
    /// thousand rows. Before, it held the whole snapshot (~120 MiB a million entries): 21 MiB for
    /// these 200,001 entries from a file to a file, 27 and 25 MiB to a server and back.
    @Test(.enabled(if: TestBackend.all.contains { $0.name == "postgres" }))
    func aCopyHoldsAPageOfWhatItMovesAtATime() async throws {
        let folder = try TemporaryDirectory()
        let laps = 100_000
        try await LongHistoryTests.loopRun(laps: laps, in: try await HopStore.open(path: folder.database))
        let server = try await TestBackend.postgres.location(folder)
        func copy(from: String, to: String) async throws -> Double {
            let (result, peakMiB) = try await LongHistoryTests.peakMemory(
                of: "hopctl", ["copy", "--from", from, "--to", to], in: folder)
            #expect(result.status == 0 && result.stdout.contains("(\(2 * laps + 1) history entries)"), "\(result)")
            return peakMiB
        }
        // What each binary takes without a copy: a status of the one run.
        func resting(_ db: String) async throws -> Double {
            let (result, peakMiB) = try await LongHistoryTests.peakMemory(
                of: "hopctl", ["status", "--flow", "loop", "--subject", "s", "--db", db], in: folder)
            #expect(result.status == 0, "\(result.stderr)")
            return peakMiB
        }
        let toFile = try await copy(from: folder.database, to: folder.path("copy.sqlite")) - resting(folder.database)
        let toServer = try await copy(from: folder.database, to: server) - resting(server)
        let fromServer = try await copy(from: server, to: folder.path("back.sqlite")) - resting(server)
        // Measured in a debug build: 4.8, 9.8 and 7.6 MiB (a part's rows, its JSON text or the
        // client's row buffer, SQLite's page cache).
        #expect(toFile < 10, "a file to a file took \(toFile) MiB above a status")
        #expect(toServer < 16, "a file to a server took \(toServer) MiB above a status")
        #expect(fromServer < 16, "a server to a file took \(fromServer) MiB above a status")
        // The copy moved every entry, in order (the rows themselves: copyMovesADeploymentToAnotherDatabaseAndBack).
        let back = try await HopStore.open(path: folder.path("back.sqlite"))
        let entries = try await back.history(runID: 1)
        #expect(entries.count == 2 * laps + 1 && entries.map(\.seq) == Array(1...Int64(2 * laps + 1)))
    }

    /// A copy killed (SIGKILL) while it writes leaves its target as empty as it found it, to a
    /// file and to a server, and the same copy run again moves everything. The copy is frozen
    /// (SIGSTOP) once it writes, and killed only when nothing of it is visible: its transaction
    /// is still open. A copy that committed before it froze is let go and the test starts over.
    @Test(arguments: TestBackend.all)
    func aCopyKilledWhileItWritesLeavesTheTargetEmptyAndRunsAgain(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let laps = 50_000
        try await LongHistoryTests.loopRun(laps: laps, in: try await HopStore.open(path: folder.database))
        let targetFolder = try TemporaryDirectory()
        let target = try await backend.location(targetFolder)
        let server = backend.name == "postgres"
        // Whether the copy has begun writing: pages of its transaction in the file's log, or its
        // transaction on the server inserting history.
        func writing() async throws -> Bool {
            if server {
                let open = try await TestDatabases.shared.psql(
                    """
                    SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                        AND backend_xid IS NOT NULL AND query LIKE 'INSERT INTO history%'
                    """, in: targetFolder)
                return open.trimmingCharacters(in: .whitespacesAndNewlines) != "0"
            }
            let log = try? FileManager.default.attributesOfItem(atPath: target + "-wal")[.size] as? Int
            return (log ?? 0) > 2 << 20
        }
        func shownRuns() async throws -> String {
            let status = try await hopctl(["status", "--json"], in: folder, db: target)
            #expect(status.status == 0, "\(status.stderr)")
            return status.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        var killed = false
        for _ in 1...3 where !killed {
            let copy = try ChildProcess(
                "hopctl", ["copy", "--from", folder.database, "--to", target], directory: folder)
            try await copy.killedIfFails {
                // A debug build beside the whole suite on 2 cores: far slower than alone (2 s).
                try await waitUntil("the copy writes", timeout: .seconds(300)) {
                    try await writing() || copy.exitStatus != nil
                }
            }
            copy.kill(SIGSTOP)
            if copy.exitStatus == nil, try await shownRuns() == "[]" {
                copy.kill(SIGKILL)
                try await copy.waitForExit()
                #expect(copy.wasSignalled, "the copy ended before it was killed: \(copy.stderr)")
                killed = true
            } else {
                // It committed before it froze: too fast to catch. Start over on an empty target.
                copy.kill(SIGCONT)
                #expect(try await copy.waitForExit(timeout: .seconds(300)) == 0, "\(copy.stderr)")
                if server {
                    try await TestDatabases.shared.psql(
                        "TRUNCATE runs, history, first_use, sessions, facts", in: targetFolder)
                } else {
                    for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: target + suffix) }
                }
            }
        }
        try #require(killed, "each copy's runs were visible when it froze: committed, or not in one transaction")
        #expect(try await shownRuns() == "[]", "the killed copy left runs in the target")
        let again = try await run(
            "hopctl", ["copy", "--from", folder.database, "--to", target], in: folder, timeout: .seconds(300))
        #expect(
            again.status == 0 && again.stdout.contains("(\(2 * laps + 1) history entries)"),
            "\(again.stdout)\(again.stderr)")
        #expect(try await backend.open(targetFolder).history(runID: 1).count == 2 * laps + 1)
    }

    /// A copy to a server whose connection the server ends while it writes (an operator's
    /// `pg_terminate_backend`, a restart) starts its transaction again, reading its source again
    /// from the start, and moves everything once: the count it prints is the second attempt's,
    /// not the sum of both.
    @Test(.enabled(if: TestBackend.all.contains { $0.name == "postgres" }))
    func aCopyWhoseServerConnectionEndsMidwayStartsAgainAndMovesEverythingOnce() async throws {
        let folder = try TemporaryDirectory()
        let laps = 50_000
        try await LongHistoryTests.loopRun(laps: laps, in: try await HopStore.open(path: folder.database))
        let targetFolder = try TemporaryDirectory()
        let target = try await TestBackend.postgres.location(targetFolder)
        var ended = false
        for _ in 1...3 where !ended {
            let copy = try ChildProcess(
                "hopctl", ["copy", "--from", folder.database, "--to", target], directory: folder)
            try await copy.killedIfFails {
                // Ends the copy's session as soon as its transaction inserts history (uncommitted).
                try await waitUntil("the copy writes", timeout: .seconds(300)) {
                    let terminated = try await TestDatabases.shared.psql(
                        """
                        SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()
                            AND backend_xid IS NOT NULL AND query LIKE 'INSERT INTO history%'
                        """, in: targetFolder)
                    ended = terminated.contains("t")
                    return ended || copy.exitStatus != nil
                }
            }
            #expect(try await copy.waitForExit(timeout: .seconds(300)) == 0, "\(copy.stderr)")
            if ended {
                #expect(
                    copy.stdout.contains("copied 1 run (\(2 * laps + 1) history entries)"), "\(copy.stdout)")
            } else {
                // It committed before it was caught writing: start over on an empty target.
                try await TestDatabases.shared.psql(
                    "TRUNCATE runs, history, first_use, sessions, facts", in: targetFolder)
            }
        }
        try #require(ended, "no copy was caught writing")
        let counted = try await TestDatabases.shared.psql(
            "SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM history", in: targetFolder)
        #expect(
            counted.trimmingCharacters(in: .whitespacesAndNewlines)
                == "\(2 * laps + 1)|\(2 * laps + 1)|1|\(2 * laps + 1)")
    }

    /// A server's database takes every command but the two that only a file has, which say what to use instead.
    @Test(.enabled(if: TestBackend.all.contains { $0.name == "postgres" }))
    func aServersDatabaseRefusesTheFileOnlyCommandsSayingWhatToUse() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let migrate = try await hopctl(["migrate"], in: folder, db: url)
        #expect(migrate.status == 0 && migrate.stdout.contains("schema version"), "\(migrate.stderr)")
        #expect(migrate.stdout.contains("postgres://"), "\(migrate.stdout)")
        try await completedStartup(folder, db: url)
        let backup = try await hopctl(["backup", folder.path("copy.sqlite")], in: folder, db: url)
        #expect(backup.status == 1 && backup.stderr.contains("pg_dump"), "\(backup.stderr)")
        #expect(!FileManager.default.fileExists(atPath: folder.path("copy.sqlite")))
        let vacuum = try await hopctl(["prune", "--finished-before", "0s", "--vacuum"], in: folder, db: url)
        #expect(vacuum.status == 1 && vacuum.stderr.contains("autovacuum"), "\(vacuum.stderr)")
        let kept = try await hopctl(["history", "--flow", "startup"], in: folder, db: url)
        #expect(kept.status == 0, "the refused prune removed the run: \(kept.stderr)")
        // A prune there says what becomes of the space, not a file's bytes or `--vacuum`.
        try await completedStartup(folder, db: url)
        let prune = try await hopctl(["prune", "--finished-before", "0s"], in: folder, db: url)
        #expect(prune.status == 0 && prune.stdout.contains("pruned 1 run "), "\(prune.stdout)\(prune.stderr)")
        #expect(prune.stdout.contains("autovacuum") && !prune.stdout.contains("--vacuum"), "\(prune.stdout)")
        #expect(!prune.stdout.contains("file system"), "\(prune.stdout)")
        // Through HOP_DB as well as --db.
        let status = try await run("hopctl", ["status", "--json"], environment: ["HOP_DB": url], in: folder)
        #expect(status.status == 0 && status.stdout.contains("\"completed\""), "\(status.stderr)")
    }
}
