import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import PostgresNIO
import Synchronization
import Testing

/// Where an engine's leases are renewed on PostgreSQL: on the connection that holds its liveness
/// lock, so that a renewal never waits for the pool of connections its other statements share.
@Suite struct PostgresLeaseRenewalTests {
    /// Every connection of the engine's pool is busy (here each waits for a row another client
    /// locked; in production, a burst of writes, or a pool that connects again after a long
    /// outage and pauses up to a minute between its tries). The renewal still goes through, on
    /// the liveness lock's connection, which connects again within 5 s. Before, it waited for a
    /// connection of the pool: for as long as the other client held its row, and meanwhile the
    /// lease ran out and another engine could take the run over.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aLeaseIsRenewedWhileEveryConnectionOfThePoolWaits() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await PostgresStore.open(url: url)
        let incarnation = store.makeIncarnation(label: "A")  // holds its liveness lock while it lives
        let owner = incarnation.id
        let soon = Date().addingTimeInterval(60)
        let held = try await store.startRun(
            flow: "f", subject: "held", version: "1", owner: owner, until: soon, durability: .now
        ).run
        let blocked = try await store.startRun(
            flow: "f", subject: "blocked", version: "1", owner: nil, until: nil, durability: .now
        ).run

        // Another client locks the row of run `blocked`; the engine's claims of it wait on every
        // connection of its pool (20), and more claims wait for a connection.
        let holder = try await PostgresConnectionLossTests.connect(url)
        let admin = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer {
            Task {
                try? await holder.close()
                try? await admin.close()
            }
        }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query("SELECT id FROM runs WHERE id = \(blocked.id) FOR UPDATE", logger: quiet).collect()
        let claims = (0..<24).map { _ in
            Task { try await store.claim(runID: blocked.id, owner: owner, until: soon) }
        }
        try await waitUntil("every connection of the pool waits for the locked row", timeout: .seconds(30)) {
            let rows = try await admin.query(
                """
                SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND application_name = 'hop' AND wait_event_type = 'Lock'
                """, logger: quiet
            ).collect()
            return try rows.first?.decode(Int64.self) == 20
        }

        let later = Date().addingTimeInterval(120)
        let renewed = Mutex<Set<Int64>?>(nil)
        let renewal = Task {
            let ids = try await store.renewLeases(owner: owner, runIDs: [held.id], until: later)
            renewed.withLock { $0 = ids }
        }
        var waited: (any Error)?
        do {
            try await waitUntil("the lease is renewed") { renewed.withLock { $0 } != nil }
        } catch {
            waited = error  // thrown once the other client let go, so that nothing is left waiting
        }
        _ = try await holder.query("ROLLBACK", logger: quiet).collect()
        for claim in claims { _ = try await claim.value }
        try await renewal.value
        try await holder.close()
        try await admin.close()
        withExtendedLifetime(incarnation) {}
        await store.close()

        if let waited { throw waited }
        #expect(renewed.withLock { $0 } == [held.id])
    }

    /// An engine that holds no run renews nothing, and its liveness connection would sit idle
    /// until a NAT or a firewall forgot it (after minutes, for many); its next renewal on it
    /// would then wait for the kernel to give up, while its leases ran out. Its listener's
    /// connection sits idle while no other store writes, and once forgotten no notification
    /// would come again. Each runs a statement every 30 s, as PostgresNIO's pool does for its
    /// idle connections. Before, the last statement each ran stayed the taking of the lock and
    /// `LISTEN` for as long as it lived.
    @Test(.enabled(if: PostgresProcessTests.available))
    func theConnectionsOfAnIdleEngineAreKeptAlive() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await PostgresStore.open(url: url)
        func psql(_ sql: String) async throws -> String {
            try await TestDatabases.shared.psql(sql, in: folder).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let incarnation = store.makeIncarnation(label: "A")
        // Waits for the lock, then claims nothing: no run exists.
        #expect(try await store.claim(runID: 1, owner: incarnation.id, until: Date().addingTimeInterval(60)) == nil)
        let key = UInt64(bitPattern: try #require(AdvisoryLock.key(ofOwner: incarnation.id)))
        func lockStatement() async throws -> String {
            try await psql(
                """
                SELECT a.query FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
                WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND l.classid::bigint = \(key >> 32) AND l.objid::bigint = \(key & 0xffff_ffff)
                """)
        }
        // Its last statement recorded the server's start, right after it took the lock (no other
        // session held it), or, 30 s later on a loaded machine, kept it alive.
        let first = try await lockStatement()
        #expect(first.hasPrefix("WITH earlier AS (DELETE FROM server_starts") || first == "SELECT 1", "\(first)")
        // The store listens once open: until its listener's keep-alive, its last statement is `LISTEN`.
        // Each comes 30 s after its connection opened: under the whole suite on 2 cores, 27 s
        // after this wait began, against a deadline of 45 s then.
        try await waitUntil("both connections run a keep-alive statement", timeout: .seconds(90)) {
            let listening = try await psql(
                """
                SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND application_name = 'hop' AND query LIKE 'LISTEN %'
                """)
            return try await lockStatement() == "SELECT 1" && listening == "0"
        }
        withExtendedLifetime(incarnation) {}
        await store.close()
    }
}
