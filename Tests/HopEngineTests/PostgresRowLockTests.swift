import Foundation
import HopEngine
import HopPostgres
import HopStore
import HopTestSupport
import PostgresNIO
import Synchronization
import Testing

/// Another client's transaction that holds the row of a run an engine executes, on PostgreSQL.
@Suite struct PostgresRowLockTests {
    /// An operator's transaction locks the row of one of the two runs a daemon executes (an
    /// `UPDATE` left uncommitted in psql or in a client's manual-commit mode) for longer than two
    /// leases, while a second daemon serves the same database. The other run's lease never runs
    /// out (read every 50 ms), and once the row is let go the locked run's lease is renewed by
    /// its owner before any claim: neither run changes hands, and each step is entered once.
    /// Before, the daemon renewed its leases in one statement that waited for the locked row,
    /// so every lease it held ran out behind it, and whichever daemon claimed the other run first
    /// got it (red in 1 of 2 runs: the owner's own claim had renewed it in the other).
    @Test(.enabled(if: PostgresProcessTests.available))
    func aRowAnotherClientLocksKeepsNoOtherLeaseOfItsEngineFromBeingRenewed() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await TestBackend.postgres.open(folder)
        // The server's start first seen long ago: no grace after it keeps a lease from running out.
        _ = try await TestDatabases.shared.psql(
            """
            INSERT INTO server_starts (started_at, first_seen_at) VALUES (pg_postmaster_start_time(), '2000-01-01')
            ON CONFLICT (started_at) DO UPDATE SET first_seen_at = EXCLUDED.first_seen_at
            """, in: folder)
        // Six runs of the flow "mixed": the first and the fourth in the step "work", which runs
        // until the test releases it; the others parked or asleep, held by no engine.
        let (owner, working) = try await Self.mixedDaemon(url, folder, store, ["--lease", "3", "--engine-id", "A"])
        defer { owner.kill() }
        let other = try ChildProcess(
            "hop-test-daemon",
            ["--db", url, "--files", folder.database, "--fleet", "--lease", "3", "--engine-id", "B"],
            keepInputOpen: true, directory: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")

        let holder = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer { Task { try? await holder.close() } }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query("SELECT id FROM runs WHERE id = \(working[0]) FOR UPDATE", logger: quiet).collect()
        // The row stays locked for 7 s (past two leases); meanwhile the other run's lease is read
        // every 50 ms, and must never have run out (by this machine's clock, the server's).
        var ranOut: [String] = []
        let until = ContinuousClock.now + .seconds(7)
        while ContinuousClock.now < until {
            let now = Date()
            if let lease = try await store.run(id: working[1])?.leaseExpiresAt, lease < now {
                ranOut.append("\(lease) at \(now)")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let history = try await store.history(runID: working[1])
        let held = try #require(try await store.run(id: working[0])?.owner)
        _ = try await holder.query("ROLLBACK", logger: quiet).collect()
        let released = Date()
        try await holder.close()
        // The locked run's lease ran out while its row was held, but the owner's renewal waited
        // for the row, ahead of any claim: it renews the lease as soon as the row is let go.
        try await waitUntil("the locked run's lease is renewed, or the run changed hands") {
            let run = try await store.run(id: working[0])
            return run?.owner != held || (run?.leaseExpiresAt ?? .distantPast) > released
        }
        #expect(try await store.run(id: working[0])?.owner == held)
        #expect(!(try await store.history(runID: working[0])).contains { $0.kind == .takeover })

        #expect(!history.contains { $0.kind == .takeover }, "\(history)\nB: \(other.stdout)")
        // Had it run out, either daemon could have claimed it first: the owner, which then
        // executes it again once its step ends, or the second daemon, beside the owner's step.
        #expect(ranOut.isEmpty, "the lease of run \(working[1]) ran out \(ranOut.count) times: \(ranOut.prefix(3))")
        for run in working {
            let entered = bodyLines(in: folder).filter { $0.hasPrefix("\(run) work") }
            #expect(entered.count == 1, "run \(run): \(entered)")
        }
        owner.closeInput()
        other.closeInput()
        _ = try await owner.waitForExit()
        _ = try await other.waitForExit()
    }

    /// An operator's transaction locks the rows of both runs a daemon executes, for longer than
    /// a lease. The daemon's renewals skip both rows, and a statement of its own waits for each
    /// in turn; once both are let go at once, each lease must be renewed for a whole lease from
    /// then. Before, the second statement took its lease's length when the first one's wait
    /// ended, from the skipping renewal's end: with a 6 s lease and an 8 s hold, it renewed a
    /// lease already over by 2 s, which stayed so until the daemon's next renewal, up to 2 s
    /// later (any engine could have taken the run meanwhile).
    @Test(.enabled(if: PostgresProcessTests.available))
    func rowsAnotherClientHeldTogetherPastALeaseAreEachRenewedForAWholeLeaseOnceLetGo() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await TestBackend.postgres.open(folder)
        // Two of six runs in the step "work", which goes on for the whole test.
        let (owner, working) = try await Self.mixedDaemon(url, folder, store, ["--lease", "6"])
        defer { owner.kill() }

        let holder = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer { Task { try? await holder.close() } }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query(
            "SELECT id FROM runs WHERE id IN (\(working[0]), \(working[1])) FOR UPDATE", logger: quiet
        ).collect()
        // How long the rows are held (past the lease), not a wait for an outcome.
        try await Task.sleep(for: .seconds(8))
        // The leases as they stand before the rows are let go (a read waits for no row lock).
        var held: [Int64: Date?] = [:]
        for run in working { held[run] = try await store.run(id: run)?.leaseExpiresAt }
        _ = try await holder.query("ROLLBACK", logger: quiet).collect()
        let released = Date()
        try await holder.close()
        // The first lease each run is given once let go: its statement that waited for the row
        // renews it at once (the second right after the first), before the daemon's next renewal.
        let renewed = Mutex<[Int64: Date]>([:])
        try await waitUntil("both leases are renewed once the rows are let go") {
            for run in working where renewed.withLock({ $0[run] }) == nil {
                let lease = try await store.run(id: run)?.leaseExpiresAt
                if let lease, lease != held[run] ?? nil { renewed.withLock { $0[run] = lease } }
            }
            return renewed.withLock { $0.count } == working.count
        }
        for (run, lease) in renewed.withLock({ $0 }) {
            #expect(
                lease.timeIntervalSince(released) > 5,
                "run \(run): renewed until \(lease.timeIntervalSince(released)) s after the release")
        }
        for run in working {
            #expect(!(try await store.history(runID: run)).contains { $0.kind == .takeover })
        }
        owner.closeInput()
        _ = try await owner.waitForExit()
    }

    /// An engine stopped while another client's transaction holds the row of a run it executes
    /// (an operator's forgotten `psql` session): its renewal of that run's lease waits for the row,
    /// in a statement of its own through the pool, and so does its release of the run as it
    /// stops; neither the engine's stop nor the store's `close()` waits for them (a daemon that
    /// did would be killed at its stop timeout). Once the row is let go, an engine started
    /// again takes the run over at once and carries it on, whatever those statements did.
    @Test(.enabled(if: PostgresProcessTests.available))
    func anEngineAndItsStoreStopWhileOneOfItsRenewalsWaitsForARowAnotherClientHolds() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let entries = Atomic<Int>(0)
        func engine(_ store: PostgresStore) -> HopEngine {
            let engine = HopEngine(
                database: store.database, logger: PostgresConnectionLossTests.quiet,
                configuration: HopEngine.Configuration(leaseDuration: .seconds(3)))
            engine.register(startupFlow())
            engine.register(step: "splash") { _ in
                entries.add(1, ordering: .sequentiallyConsistent)
                try await Task.sleep(for: .seconds(600))  // until cancelled
            }
            return engine
        }
        let store = try await PostgresStore.open(url: url)
        // The server's start first seen long ago: the engine started again may take a run of a
        // gone engine at once (no grace after a server's start).
        _ = try await TestDatabases.shared.psql(
            """
            INSERT INTO server_starts (started_at, first_seen_at) VALUES (pg_postmaster_start_time(), '2000-01-01')
            ON CONFLICT (started_at) DO UPDATE SET first_seen_at = EXCLUDED.first_seen_at
            """, in: folder)
        let first = engine(store)
        let service = Task { try await first.run() }
        defer { service.cancel() }
        let run = try await first.start("startup")
        try await waitUntil("the splash is entered") { entries.load(ordering: .sequentiallyConsistent) == 1 }

        let holder = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer { Task { try? await holder.close() } }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query("SELECT id FROM runs WHERE id = \(run.id) FOR UPDATE", logger: quiet).collect()
        // The next renewal skips the row, and leaves a statement waiting for it.
        try await Self.waitUntilAStatementWaitsForALock(
            "a statement of the engine waits for the locked row", in: folder)

        let stopped = Atomic<Bool>(false)
        let stopping = Task {
            service.cancel()
            _ = try? await service.value
            await store.close()
            stopped.store(true, ordering: .sequentiallyConsistent)
        }
        defer { stopping.cancel() }
        // With the row still held: a stop that waited for it would never end.
        try await waitUntil("the engine has stopped and its store is closed", timeout: .seconds(30)) {
            stopped.load(ordering: .sequentiallyConsistent)
        }
        _ = try await holder.query("ROLLBACK", logger: quiet).collect()
        try await holder.close()

        let again = try await PostgresStore.open(url: url)
        let second = engine(again)
        let secondService = Task { try await second.run() }
        defer { secondService.cancel() }
        try await waitUntil("the engine started again enters the splash again") {
            entries.load(ordering: .sequentiallyConsistent) == 2
        }
        let history = try await again.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .takeover], "\(history)")
        #expect(try await again.run(id: run.id)?.owner == second.incarnation.id)
        secondService.cancel()
        _ = try? await secondService.value
        await again.close()
    }

    /// A daemon killed while one of its statements waits for a row another client holds leaves
    /// that statement's server session behind: the server sees its connection closed only when
    /// it answers, and until the row is let go the session takes a connection slot (a daemon
    /// restarted in a loop beside a forgotten `psql` session takes one more at each start). The
    /// README tells operators of PostgreSQL 14 and later to set `client_connection_check_interval`
    /// for the engines' role, and the server then ends such a session soon after its client is
    /// gone. Set here for the test's database only (1 s); without it, the session waits on as
    /// long as the row is held (red when the setting is left out).
    @Test(.enabled(if: PostgresProcessTests.available))
    func aSessionAKilledDaemonLeftWaitingForALockedRowEndsWithTheConnectionCheckTheReadmeAdvises() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await TestBackend.postgres.open(folder)
        // Before the daemon connects: a role's settings apply to the sessions that start later.
        _ = try await TestDatabases.shared.psql(
            """
            DO $$ BEGIN
              EXECUTE format('ALTER ROLE %I IN DATABASE %I SET client_connection_check_interval = %L',
                current_user, current_database(), '1s');
            END $$
            """, in: folder)
        // Two of six runs in the step "work", which runs until the daemon is killed.
        let (daemon, working) = try await Self.mixedDaemon(url, folder, store, ["--lease", "3"])
        defer { daemon.kill() }
        let locked = working[0]

        let holder = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer { Task { try? await holder.close() } }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query("SELECT id FROM runs WHERE id = \(locked) FOR UPDATE", logger: quiet).collect()
        @Sendable func waiting() async throws -> Int {
            let count = try await TestDatabases.shared.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                in: folder)
            return Int(count.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
        }
        // The daemon's next renewal skips the row, and leaves a statement waiting for it.
        try await waitUntil("a statement of the daemon waits for the locked row") { try await waiting() >= 1 }
        daemon.kill()
        _ = try await daemon.waitForExit()
        try await waitUntil("the sessions the killed daemon left waiting for the row have ended", timeout: .seconds(30))
        {
            try await waiting() == 0
        }
        _ = try await holder.query("ROLLBACK", logger: quiet).collect()
        try await holder.close()
    }

    /// Waits until a statement on the test's database (whose folder is `folder`) waits for a
    /// lock, which `what` names: read by psql, in a session of its own each time (a transaction
    /// sees `pg_stat_activity` as it was when it first read it).
    static func waitUntilAStatementWaitsForALock(_ what: String, in folder: TemporaryDirectory) async throws {
        try await waitUntil(what) {
            let waiting = try await TestDatabases.shared.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                in: folder)
            return (Int(waiting.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) >= 1
        }
    }

    /// Starts `hop-test-daemon --mixed 6` with `arguments` on the test's database at `url`, and
    /// returns it, once its six runs are there, with the ids of the two in the step "work" (which
    /// goes on until the test releases it, or the daemon ends), lowest first. Killed if that fails.
    private static func mixedDaemon(
        _ url: String, _ folder: TemporaryDirectory, _ store: any HopAdministration, _ arguments: [String]
    ) async throws -> (ChildProcess, [Int64]) {
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", url, "--files", folder.database, "--mixed", "6"] + arguments,
            keepInputOpen: true, directory: folder)
        return try await daemon.killedIfFails {
            try await daemon.waitForOutput("started 6")
            let working = try await store.runs(flow: "mixed", subject: nil, limit: 10)
                .filter { $0.status == .running && $0.currentStep == "work" }.map(\.id).sorted()
            try #require(working.count == 2, "\(daemon.stdout)")
            return (daemon, working)
        }
    }
}
