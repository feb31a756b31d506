import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import InMemoryLogging
import Logging
import Synchronization
import Testing

/// A database with a `lock_timeout`, as many have (so that no client queues behind an
/// operator's `VACUUM FULL` or schema change for long): the locks Hop takes to order its own
/// transactions are waited for as long as the transaction that holds them lasts, never refused
/// after `lock_timeout`. Each test holds such a lock from another session for longer than the
/// timeout (a slow commit, a long park), and a store's write must wait for it and succeed.
@Suite struct PostgresLockTimeoutTests {
    /// The lock that orders a login with a park of the same subject (`hop.subject`), held by
    /// another session for longer than the database's `lock_timeout` of 100 ms: the login and a
    /// park of the subject's run both wait, and succeed once it is let go. Before, both failed
    /// with "canceling statement due to lock timeout", and `hopctl session login` exited 1 in a
    /// SystemdTests demo test, whose database sets 100 ms, when the demo's park took longer.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aLoginAndAParkWaitForTheLockOfTheirSubjectWhateverTheLockTimeout() async throws {
        let (server, url) = try await Self.serverWithALockTimeout()
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: url)
        let owner = "A#0123456789abcdef"  // no liveness lock of this store: not waited for
        let parked = try await store.startRun(
            flow: "startup", subject: "alice", version: "1", owner: owner, until: Date().addingTimeInterval(600),
            durability: .now
        ).run

        let holder = try await server.session(
            running: "SELECT pg_advisory_lock(hashtext('hop.subject'), hashtext('alice'))", database: "timeouts",
            in: folder)
        defer { holder.kill() }
        let failures = Failures()
        let park = Task {
            try await failures.noting {
                try await store.record(
                    [.hop(step: "login", from: nil, parks: true, wakeOn: .sessionStored, deadline: nil)],
                    runID: parked.id, owner: owner, durability: .now)
            }
        }
        let login = Task {
            try await failures.noting {
                try await store.storeSession(subject: "alice", userID: "alice", token: Token.random(), expiresAt: nil)
            }
        }
        try await Self.waitForLocks(
            statementsWaiting: 2, on: "advisory", longerThan: "300 ms", server: server, failures: failures)

        holder.closeInput()  // psql exits, and the lock goes with its session
        _ = try await park.value
        _ = try await login.value
        let run = try #require(try await store.run(id: parked.id))
        #expect(run.status != .parked, "the login woke the run parked at login")
        await store.close()
    }

    /// The lock the server takes at `COMMIT` to order every transaction that sends a
    /// notification, held by another session for longer than the `lock_timeout` of 100 ms (its
    /// commit waits for a synchronous standby; in production, any slow commit of a busy server,
    /// and that lock is one for the whole server): a steering command's write, which notifies the
    /// engines, waits and commits once it is let go. Before, its commit failed with "canceling
    /// statement due to lock timeout".
    @Test(.enabled(if: PostgresProcessTests.available))
    func aWriteThatNotifiesWaitsForAnotherCommitWhateverTheLockTimeout() async throws {
        let (server, url) = try await Self.serverWithALockTimeout()
        let folder = try TemporaryDirectory()
        // A commit that asks for it waits for a standby that never comes; Hop's commits do not.
        try await server.psql("ALTER DATABASE timeouts SET synchronous_commit = local")
        try await server.psql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        try await server.psql("SELECT pg_reload_conf()")
        let store = try await PostgresStore.open(url: url)

        let holder = try server.client(
            // It writes (a commit that wrote nothing does not wait for a standby).
            running:
                "SET synchronous_commit = on; BEGIN; SELECT pg_notify('other', ''); CREATE TABLE t (x int); COMMIT",
            database: "timeouts", in: folder)
        defer { holder.kill() }
        try await waitUntil("the other commit waits for its standby, holding the lock", timeout: .seconds(30)) {
            try await server.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'timeouts' AND wait_event = 'SyncRep'"
            ).trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }
        let failures = Failures()
        let start = Task {
            try await failures.noting {
                try await store.startRun(
                    flow: "startup", subject: "alice", version: "1", owner: nil, until: nil, durability: .now)
            }
        }
        try await Self.waitForLocks(
            statementsWaiting: 1, on: "object", longerThan: "300 ms", server: server, failures: failures)

        try await server.psql("ALTER SYSTEM RESET synchronous_standby_names")
        try await server.psql("SELECT pg_reload_conf()")  // the other commit ends, and lets go
        let run = try await start.value
        #expect(run.created)
        await store.close()
    }

    /// An engine's liveness lock, taken again on a new connection after its connection went,
    /// while another session holds its key for longer than the database's `lock_timeout` of
    /// 100 ms, a session the engine may not end (a superuser's; in production, the engine's own
    /// old session, which the server ends only once it notices its connection went, is ended by
    /// the engine: `PostgresConnectionLossTests`): the take waits, and the engine holds its lock
    /// again as soon as the key is let go. Before, the take was refused after 100 ms and tried
    /// again with a growing pause, and the engine said it could not take its liveness lock again.
    @Test(.enabled(if: PostgresProcessTests.available))
    func theLivenessLockTakenAgainIsWaitedForWhateverTheLockTimeout() async throws {
        let (server, _) = try await Self.serverWithALockTimeout()
        let url = try await server.createRole("engine", owning: "timeouts")
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await PostgresStore.open(url: url, logger: logs.logger(label: "store"))
        let incarnation = store.makeIncarnation(label: "A")
        let key = try #require(AdvisoryLock.key(ofOwner: incarnation.id))
        func holders() async throws -> [PostgresProcessTests.LockHolder] {
            try await PostgresProcessTests.livenessLockHolders(on: server, "timeouts")
        }
        try await waitUntil("the engine holds its liveness lock", timeout: .seconds(30)) {
            try await holders().count == 1
        }
        let first = try await holders()[0]

        // Another session asks for the key, and gets it once the engine's connection is ended.
        let taker = try await PostgresProcessTests.sessionWaitingForALock(
            running: "SET lock_timeout = 0; SELECT pg_advisory_lock(\(key))", on: server, "timeouts", in: folder)
        defer { taker.kill() }
        _ = try await server.psql("SELECT pg_terminate_backend(\(first.pid))", database: "timeouts")
        try await Self.waitForLocks(
            statementsWaiting: 1, on: "advisory", longerThan: "300 ms", server: server, failures: Failures())

        taker.closeInput()  // psql exits, and the key goes with its session
        try await waitUntil("the engine holds its liveness lock again", timeout: .seconds(30)) {
            let now = try await holders()
            return now.count == 1 && now[0] != first && now[0].application == "hop"
        }
        let said = logs.texts(atLeast: .debug)
        #expect(!said.contains { $0.contains("cannot take this engine's liveness lock again") }, "\(said)")
        #expect(
            said.contains {
                $0.contains("cannot end the session on the server that still holds this engine's liveness lock")
            },
            "\(said)")
        withExtendedLifetime(incarnation) {}
        await store.close()
    }

    /// A lock another client holds longer than the database's `lock_timeout` (an operator's
    /// `LOCK TABLE`, a `VACUUM FULL`), which Hop's statements honour: the one refused is
    /// PostgreSQL's busy, as SQLite's write lock held past the busy timeout is. `.busy`, "the
    /// database is busy", what to check, and nothing changed; `hopctl` says so and exits 1.
    /// Before, it was a `.postgres` error in the server's words ("canceling statement due to lock
    /// timeout") that said neither what held it nor what to do.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aStatementRefusedByTheLockTimeoutIsBusyAndSaysWhatToCheck() async throws {
        let (server, url) = try await Self.serverWithALockTimeout()
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: url)
        let started = try await store.startRun(
            flow: "startup", subject: "alice", version: "1", owner: nil, until: nil, durability: .now
        ).run
        let before = try await store.history(runID: started.id)

        let holder = try await server.session(
            running: "BEGIN; LOCK TABLE runs IN ACCESS EXCLUSIVE MODE", database: "timeouts", in: folder)
        defer { holder.kill() }
        let refused = await #expect(throws: HopError.self) {
            _ = try await store.cancelRun(flow: "startup", subject: "alice", runID: started.id, reason: "by the test")
        }
        #expect(refused?.code == .busy, "\(String(describing: refused))")
        #expect(refused?.reason.hasPrefix("the database is busy: another session held a lock") == true)
        #expect(refused?.hint?.contains("pg_stat_activity") == true, "\(String(describing: refused))")
        let cancel = try await run(
            "hopctl", ["cancel", "--flow", "startup", "--subject", "alice", "--run", "\(started.id)", "--db", url],
            in: folder)
        #expect(cancel.status == 1, "\(cancel.stdout)\(cancel.stderr)")
        #expect(
            cancel.stderr.contains("the database is busy") && cancel.stderr.contains("lock_timeout"), "\(cancel.stderr)"
        )

        holder.closeInput()  // psql exits, and the lock goes with its session
        try await waitUntil("the table is free") { (try? await store.run(id: started.id)) != nil }
        #expect(try await store.run(id: started.id)?.status == started.status, "the refused cancel changed the run")
        #expect(try await store.history(runID: started.id) == before)
        await store.close()
    }

    /// A run's row locked by another transaction a little longer than the database's
    /// `lock_timeout` of 100 ms (another of Hop's transactions of the run, slow to commit on a
    /// loaded server): the engine's write of the run is refused by the timeout, tried again, and
    /// commits once the row is let go. Before, it failed as busy after 100 ms, and the engine
    /// stopped the run and resumed it from its history (a step whose end was refused ran again).
    ///
    /// The other session keeps the row until the write was refused once (the server logs it),
    /// then 0.4 s more, all on the server, whatever the speed of the test's process. (It looked
    /// for a write waiting in `pg_stat_activity` before, a wait of 100 ms that a loaded server
    /// could see late: once, in CI, the row was kept past the write's budget of tries.)
    @Test(.enabled(if: PostgresProcessTests.available))
    func aRowLockHeldBrieflyPastTheLockTimeoutIsWaitedOut() async throws {
        let (server, url) = try await Self.serverWithALockTimeout()
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: url)
        let owner = "A#0123456789abcdef"  // no liveness lock of this store: not waited for
        let started = try await store.startRun(
            flow: "startup", subject: "alice", version: "1", owner: owner, until: Date().addingTimeInterval(600),
            durability: .now
        ).run

        let holder = try server.client(
            running: """
                BEGIN;
                SELECT 1 FROM runs WHERE id = \(started.id) FOR UPDATE;
                DO $$
                BEGIN
                    LOOP
                        EXIT WHEN position('canceling statement due to lock timeout'
                            IN pg_read_file('\(server.folder.path("server.log"))')) > 0;
                        PERFORM pg_sleep(0.01);
                    END LOOP;
                    PERFORM pg_sleep(0.4);
                END $$;
                COMMIT
                """, database: "timeouts", in: folder)
        defer { holder.kill() }
        try await waitUntil("the other session holds the run's row and waits for a write of Hop's") {
            try await server.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'psql' AND wait_event = 'PgSleep'",
                database: "timeouts"
            ).trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }

        let entries = try await store.record(
            [.hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil)], runID: started.id,
            owner: owner, durability: .now)
        #expect(entries.map(\.kind) == [.hop])
        let log = try String(contentsOfFile: server.folder.path("server.log"), encoding: .utf8)
        #expect(log.contains("canceling statement due to lock timeout"), "the write was never refused: \(log)")
        #expect(try await store.history(runID: started.id).map(\.kind) == [.hop])
        await store.close()
    }

    /// A server of the test's own whose database `timeouts` has a `lock_timeout` of 100 ms, and
    /// the database's URL.
    static func serverWithALockTimeout() async throws -> (PostgresServer, String) {
        let (server, url) = try await PostgresServer.ofItsOwn(database: "timeouts")
        try await server.psql("ALTER DATABASE timeouts SET lock_timeout = '100ms'")
        return (server, url)
    }

    /// Waits until `count` of the store's statements wait for a lock of type `event`
    /// (`pg_stat_activity.wait_event`) for longer than `duration`: longer than the database's
    /// `lock_timeout`, which would have ended them by then. Throws as soon as one of the writes
    /// waiting failed (`failures`).
    static func waitForLocks(
        statementsWaiting count: Int, on event: String, longerThan duration: String, server: PostgresServer,
        failures: Failures
    ) async throws {
        try await waitUntil("\(count) statements wait for a lock for \(duration)", timeout: .seconds(30)) {
            if let failure = failures.first { throw TestFailure("a write that waited failed: \(failure)") }
            let waiting = try await server.psql(
                """
                SELECT count(*) FROM pg_stat_activity
                WHERE application_name = 'hop' AND wait_event_type = 'Lock' AND wait_event = '\(event)'
                    AND clock_timestamp() - query_start > interval '\(duration)'
                """)
            return waiting.trimmingCharacters(in: .whitespacesAndNewlines) == "\(count)"
        }
    }

    /// The errors of the writes a test started in tasks of their own, as they fail.
    final class Failures: Sendable {
        private let errors = Mutex<[String]>([])

        var first: String? { errors.withLock { $0.first } }

        /// Runs `write`, noting its error before throwing it.
        @Sendable func noting<T>(_ write: () async throws -> T) async throws -> T {
            do {
                return try await write()
            } catch {
                errors.withLock { $0.append("\(error)") }
                throw error
            }
        }
    }
}
