import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A fleet's server fails over: its standby, which replays everything the primary writes, is
/// promoted, and the address the engines connect to now reaches it (a virtual IP or a DNS name
/// moved; here a symbolic link to the server's socket). The failover ends every engine's
/// connection, so for a moment none holds its liveness lock on the new primary.
@Suite struct PostgresFailoverTests {
    /// Daemon A runs a step and is slow to come back after the failover (frozen for its first
    /// seconds); daemon B is back first. B must not take A's missing lock for A's death: A's
    /// step runs once, on A, and the run never changes hands. Before, the grace after a server's
    /// start (15 s) was counted from the start of the server process, and a standby promoted
    /// after running for longer than that gave none: B took the run over at its first look and
    /// ran the splash beside A's. Now it counts from when an engine first found the new primary.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aFailoverNeverHandsARunInFlightToTheDaemonBackFirst() async throws {
        let (primary, standby, front) = try await Front.toAPrimaryWithAStandby(database: "failover")
        let url = front.url

        let folder = try TemporaryDirectory()
        let owner = try await PostgresProcessTests.ownerInItsSplash(url: url, in: folder)
        defer { owner.kill() }
        let other = try PostgresProcessTests.daemon("B", url: url, in: folder)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        try await waitUntil("the standby replayed A's hop to its splash", timeout: .seconds(60)) {
            let hops = try? await standby.psql(
                "SELECT count(*) FROM history WHERE run_id = 1 AND kind = 'hop'", database: "failover")
            return hops?.trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        }
        // Counted from the standby's own start, the grace would be over.
        try await waitUntil("the standby started more than 16 s ago", timeout: .seconds(60)) {
            try await standby.age() > 16
        }

        try await stopEveryThread(of: owner.processIdentifier)
        defer { owner.kill(SIGCONT) }
        try await primary.stopAtOnce()
        try await standby.promote()
        try front.point(to: standby)
        func holders() async throws -> Set<PostgresProcessTests.LockHolder> {
            Set(try await PostgresProcessTests.livenessLockHolders(on: standby, "failover"))
        }
        try await waitUntil("B holds its liveness lock on the new primary", timeout: .seconds(30)) {
            (try? await holders())?.count == 1
        }
        // B looks for engines that are gone every second: before, it took the run at its first look.
        let back = ContinuousClock.now
        try await waitUntil("B has looked for 3 s on the new primary") { ContinuousClock.now - back > .seconds(3) }
        owner.kill(SIGCONT)
        try await waitUntil("A holds its liveness lock on the new primary", timeout: .seconds(30)) {
            (try? await holders())?.count == 2
        }
        try await PostgresProcessTests.endSplash(of: owner, keptFrom: other, url: url, in: folder)
    }

    /// How a server comes back without its last commits, under running engines.
    enum LastCommitsLost: String, CustomStringConvertible, Sendable {
        /// A failover to an asynchronous standby that had stopped receiving.
        case failover
        /// The server restored from a physical backup (`pg_basebackup`): the same tables, so
        /// not taken for a replaced database.
        case physicalRestore
        var description: String { rawValue }
    }

    /// With asynchronous replication, a failover may lose the old primary's last commits; a
    /// physical backup restored under running engines loses what came after it. Here the
    /// standby stopped receiving (or the backup was taken) while daemon A was in its splash; A
    /// then ended the splash and began a durable sleep (the splash's unhop and the timer, in
    /// the last commits), and was frozen until the server it reaches lacked them. Woken, A went
    /// on with its run as it knew it, on a history that no longer held the splash's end:
    /// before, it appended its first-use decision after the splash's hop, and the hop to
    /// onboarding was refused (the splash was still in flight in the database), so the run
    /// failed. Now each of its writes names the last history entry it saw, a write that finds
    /// another last entry is refused, and A executes the run again from the history the server
    /// holds: the splash runs again (as after a crash before its unhop was durable) and the run
    /// goes on to onboarding.
    @Test(.enabled(if: PostgresProcessTests.available), arguments: [LastCommitsLost.failover, .physicalRestore])
    func aDaemonWhoseLastCommitsWereLostExecutesItsRunAgainFromTheServer(_ how: LastCommitsLost) async throws {
        // Only a failover needs a standby: a physical restore puts a backup in the primary's place.
        let (primary, standby, front) = try await Front.toAPrimary(database: "lost", withStandby: how == .failover)
        let folder = try TemporaryDirectory()
        let owner = try ChildProcess(
            "hop-test-daemon",
            [
                "--db", front.url, "--files", folder.database, "--external", "--engine-id", "A", "--lease", "60",
                "--sleep", "1",
            ],
            // A stops itself once the timer is committed: the sleep ends only once the commit is lost.
            environment: ["HOP_TEST_SPLASH_WAITS": "1", "HOP_TEST_STOP_AT": "after:timer:sleep"], keepInputOpen: true,
            directory: folder)
        defer { owner.kill() }
        try await owner.waitForOutput("point after:hop:splash")
        func entries(on server: PostgresServer) async throws -> [String] {
            try await server.psql(
                "SELECT kind || ':' || coalesce(step, '-') FROM history WHERE run_id = 1 ORDER BY seq", database: "lost"
            ).split(whereSeparator: \.isNewline).map(String.init)
        }
        var backup: TemporaryDirectory?
        switch how {
        case .failover:
            let standby = try #require(standby)
            try await waitUntil("the standby replayed A's hop to its splash") {
                (try? await entries(on: standby)) == ["hop:splash"]
            }
            try await standby.stopReceiving()
        case .physicalRestore:
            backup = try await primary.physicalBackup()
        }

        owner.closeInput()
        try await owner.waitForOutput("point after:timer:sleep")
        try await stopEveryThread(of: owner.processIdentifier)  // stopped already: waits until every thread is
        defer { owner.kill(SIGCONT) }
        let written = try await entries(on: primary)
        // Once, under the whole suite, the primary held the decision that follows the sleep, as
        // if A had gone on after stopping itself: said with what A printed and its state.
        #expect(
            written.suffix(2) == ["unhop:splash", "timer:sleep"],
            """
            \(written)
            A: \(owner.stdout)
            \((try? String(contentsOfFile: "/proc/\(owner.processIdentifier)/status", encoding: .utf8))?
                .split(separator: "\n").filter { $0.hasPrefix("State") || $0.hasPrefix("SigQ") }.joined(separator: "; ") ?? "")
            """)
        let server: PostgresServer
        switch how {
        case .failover:
            let standby = try #require(standby)
            try await primary.stopAtOnce()
            try await standby.promote()
            try front.point(to: standby)
            server = standby
        case .physicalRestore:
            try await primary.restore(try #require(backup))
            server = primary
        }
        #expect(try await entries(on: server) == ["hop:splash"], "the server lacks what A wrote last")
        owner.kill(SIGCONT)

        try await owner.waitForOutput("parked onboarding", timeout: .seconds(90))
        // Each entry once, in the flow's order: nothing A wrote afterwards follows the lost
        // entries' places, and nothing failed.
        #expect(
            try await entries(on: server) == [
                "hop:splash", "unhop:splash", "timer:sleep", "decision:isFirstUse(onboarding)", "hop:onboarding",
            ])
        let status = try await server.psql("SELECT status FROM runs WHERE id = 1", database: "lost")
        #expect(status.trimmingCharacters(in: .whitespacesAndNewlines) == "parked")
        #expect(
            bodyLines(in: folder).filter { $0 == "1 splash" }.count == 2,
            "the splash, whose end was lost, ran again")
    }

    /// Each start of the server (a restart, a failover) gives `server_starts` a row. Before, the
    /// rows of earlier starts were kept for the life of the database; now an engine that records
    /// the current start removes them, and keeps the current start's row as it was.
    @Test(.enabled(if: PostgresProcessTests.available))
    func theRowsOfTheServersEarlierStartsAreRemoved() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await PostgresStore.open(url: url)
        func psql(_ sql: String) async throws -> String {
            try await TestDatabases.shared.psql(sql, in: folder).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        // Two earlier starts, and the current one first seen long ago.
        _ = try await psql(
            """
            INSERT INTO server_starts (started_at, first_seen_at) VALUES
                (pg_postmaster_start_time() - interval '2 days', pg_postmaster_start_time() - interval '2 days'),
                (pg_postmaster_start_time() - interval '1 day', pg_postmaster_start_time() - interval '1 day'),
                (pg_postmaster_start_time(), '2000-01-01 00:00:00+00')
            ON CONFLICT (started_at) DO UPDATE SET first_seen_at = EXCLUDED.first_seen_at
            """)
        #expect(try await psql("SELECT count(*) FROM server_starts") == "3")
        // An engine takes its liveness lock and records the server's start: the claim waits for it.
        let incarnation = store.makeIncarnation(label: "A")
        #expect(try await store.claim(runID: 1, owner: incarnation.id, until: Date().addingTimeInterval(60)) == nil)
        let left = try await psql(
            "SELECT started_at = pg_postmaster_start_time(), extract(year FROM first_seen_at) FROM server_starts")
        #expect(left == "t|2000", "\(left)")
        withExtendedLifetime(incarnation) {}
        await store.close()
    }
}

/// The address a fleet's engines connect to, which a failover moves from one server to another
/// (a virtual IP or a DNS name; here a socket that is a symbolic link to a server's).
private struct Front {
    let folder: TemporaryDirectory
    /// The URL of the database, through the front.
    let url: String

    init(database: String) throws {
        folder = try TemporaryDirectory()
        let host = folder.path("").hasSuffix("/") ? String(folder.path("").dropLast()) : folder.path("")
        url = "postgres://postgres@/\(database)?host=\(host)"
    }

    /// A server of a test's own with database `name`, its standby, and a front that reaches the server.
    static func toAPrimaryWithAStandby(
        database name: String
    ) async throws -> (primary: PostgresServer, standby: PostgresServer, front: Front) {
        let (primary, standby, front) = try await toAPrimary(database: name, withStandby: true)
        guard let standby else { throw TestFailure("no standby was made") }
        return (primary, standby, front)
    }

    /// A server of a test's own with database `name`, its standby when `withStandby`, and a
    /// front that reaches the server.
    static func toAPrimary(
        database name: String, withStandby: Bool
    ) async throws -> (primary: PostgresServer, standby: PostgresServer?, front: Front) {
        let (primary, _) = try await PostgresServer.ofItsOwn(database: name)
        let standby = withStandby ? try await primary.standby() : nil
        let front = try Front(database: name)
        try front.point(to: primary)
        return (primary, standby, front)
    }

    /// Makes the front reach `server`, at once for every new connection.
    func point(to server: PostgresServer) throws {
        let next = folder.path("next")
        unlink(next)
        guard symlink(server.folder.path(".s.PGSQL.\(server.port)"), next) == 0,
            rename(next, folder.path(".s.PGSQL.\(server.port)")) == 0
        else { throw TestFailure("cannot link the front socket: \(String(cString: strerror(errno)))") }
    }
}
