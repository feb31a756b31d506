import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import InMemoryLogging
import Logging
import PostgresNIO
import Synchronization
import Testing

/// What HopPostgres does when the server ends its connections (a restart or stop of the server,
/// an operator's `pg_terminate_backend`): a statement on a connection that closed ends, and a
/// wait for the liveness lock ends with its task.
@Suite struct PostgresConnectionLossTests {
    static let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// A connection of its own to `url`'s database.
    static func connect(_ url: String) async throws -> PostgresConnection {
        try await PostgresConnection.connect(
            configuration: try PostgresURL(url).connectionConfiguration(), id: 99, logger: quiet)
    }

    /// PostgresNIO loses a statement written to a connection that has just closed: its caller
    /// waits forever, cancelled or not. An engine's watch, lease renewals, stop and liveness
    /// lock went through that when the server ended a connection as it was handed out: `hop-demo`
    /// sent SIGTERM with its server stopped ran on (2 of 40 tries under load); one whose sessions
    /// an operator ended never took its liveness lock again, and its run never went on.
    /// Watched (``ClosedConnections``), the statement ends with ``ConnectionClosed``.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aStatementOnAConnectionThatClosedEndsInsteadOfWaitingForever() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let connection = try await Self.connect(url)
        try await connection.close()

        let started = ContinuousClock.now
        await #expect(throws: ConnectionClosed.self) {
            try await ClosedConnections.run(on: connection) { connection in
                try await connection.query("SELECT 1", logger: Self.quiet).collect().count
            }
        }
        #expect(ContinuousClock.now - started < .seconds(10))

        // The library's own behaviour, which makes the watch needed: unwatched, the same statement
        // is still unanswered seconds later. (Should a new PostgresNIO answer it, this fails: the
        // watch may then go.)
        let answered = Flag()
        let unwatched = Task {
            _ = try? await connection.query("SELECT 1", logger: Self.quiet).collect()
            answered.set()
        }
        let asked = ContinuousClock.now
        try await waitUntil("3 s passed") { ContinuousClock.now - asked > .seconds(3) }
        unwatched.cancel()
        try await waitUntil("1 s more passed") { ContinuousClock.now - asked > .seconds(4) }
        #expect(!answered.isSet, "PostgresNIO answered a statement on a closed connection")
    }

    /// A statement the server answers with an error as it ends the connection (a session
    /// ended by an operator mid-statement) gets the server's error, not ``ConnectionClosed``:
    /// the watch lets the answer of a statement that went out before the close arrive.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aStatementWhoseSessionIsEndedGetsTheServersError() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let connection = try await Self.connect(url)
        let other = try await Self.connect(url)
        defer {
            Task {
                try? await connection.close()
                try? await other.close()
            }
        }
        let pid = try #require(
            try await connection.query("SELECT pg_backend_pid()", logger: Self.quiet).collect().first?
                .decode(Int32.self))

        let sleeping = Task {
            try await ClosedConnections.run(on: connection) { connection in
                try await connection.query("SELECT pg_sleep(60)", logger: Self.quiet).collect().count
            }
        }
        try await waitUntil("the statement runs") {
            let rows = try await other.query(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = \(pid) AND query LIKE '%pg_sleep%' AND state = 'active'",
                logger: Self.quiet
            ).collect()
            return try rows.first?.decode(Int64.self) == 1
        }
        _ = try await other.query("SELECT pg_terminate_backend(\(pid))", logger: Self.quiet).collect()
        let result = await sleeping.result
        guard case .failure(let error) = result else {
            Issue.record("the statement ended without an error")
            return
        }
        let state = (error as? PSQLError)?.serverInfo?[.sqlState]
        #expect(state == "57P01", "\(String(reflecting: error))")
    }

    /// A claim waits for its owner's liveness lock while the lock is taken again, which waits
    /// as long as another session the engine may not end holds it (a superuser's). Cancelled
    /// (the engine stops), the claim ends at once, whether cancelled before it began to wait or
    /// while it waited. Before, it waited for the lock: an engine whose watch was in such a
    /// claim as it stopped did not stop.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aClaimWaitingForItsLivenessLockEndsWhenCancelled() async throws {
        let (server, url) = try await PostgresServer.ofItsOwn(database: "claims")
        let engineURL = try await server.createRole("engine", owning: "claims")
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await PostgresStore.open(url: engineURL, logger: logs.logger(label: "hop.store"))
        let incarnation = store.makeIncarnation(label: "A")
        let owner = incarnation.id
        let key = try #require(AdvisoryLock.key(ofOwner: owner))
        let until = Date().addingTimeInterval(60)
        // Waits for the lock to be held, then claims nothing: no run exists.
        #expect(try await store.claim(runID: 1, owner: owner, until: until) == nil)

        // Another session waits for the engine's lock, and gets it once the engine's session is ended.
        let holder = try await Self.connect(url)
        let admin = try await Self.connect(url)
        defer {
            Task {
                try? await holder.close()
                try? await admin.close()
            }
        }
        let holding = Task {
            try await holder.query("SELECT pg_advisory_lock(\(key))", logger: Self.quiet).collect().count
        }
        /// Whether one session waits for an advisory lock.
        func oneWaits() async throws -> Bool {
            let rows = try await admin.query(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", logger: Self.quiet
            ).collect()
            return try rows.first?.decode(Int64.self) == 1
        }
        try await waitUntil("the other session waits for the lock") { try await oneWaits() }
        _ = try await admin.query(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            logger: Self.quiet
        ).collect()
        _ = try await holding.value
        func said(_ text: String) -> Bool { logs.texts().contains { $0.contains(text) } }
        try await waitUntil("the engine's session was ended") {
            said("lost the connection holding this engine's liveness lock")
        }
        try await waitUntil("the engine waits to take its lock again") { try await oneWaits() }

        let claims = Claims()
        func claim(_ name: String) -> Task<Void, Never> {
            Task {
                let outcome: String
                do {
                    let claimed = try await store.claim(runID: 1, owner: owner, until: until)
                    outcome = "returned \(String(describing: claimed))"
                } catch {
                    outcome = "\(error)"
                }
                claims.end(name, outcome)
            }
        }
        claims.cancelled("cancelled before it waited")
        claim("cancelled before it waited").cancel()
        let waiting = claim("cancelled while it waited")
        // It waits: nothing ends it while the other session holds the lock.
        let asked = ContinuousClock.now
        try await waitUntil("a second passed") { ContinuousClock.now - asked > .seconds(1) }
        #expect(claims.ended["cancelled while it waited"] == nil, "\(claims.ended)")
        claims.cancelled("cancelled while it waited")
        waiting.cancel()
        do {
            try await waitUntil("both claims ended") { claims.ended.count == 2 }
        } catch {
            // Lets the claims still waiting end, so that the store closes.
            try await holder.close()
            throw TestFailure("\(error): ended \(claims.ended)")
        }
        for (name, (after, outcome)) in claims.ended {
            #expect(after < .seconds(5), "\(name): \(after)")
            #expect(outcome.contains("cancelled"), "\(name): \(outcome)")
        }
        // The lock is taken again once the other session lets go of it.
        try await holder.close()
        #expect(try await store.claim(runID: 1, owner: owner, until: until) == nil)
        _ = incarnation
        await store.close()
    }

    /// The connection holding an engine's liveness lock went without the server noticing (a
    /// NAT or a firewall forgot it, the engine's end gave up on it): the server keeps the old
    /// session, and the lock, until its TCP keep-alive gives up, hours by default. Stood in for
    /// by a session of the engine's role that waits for the key and gets it as the engine's
    /// session is ended. The engine ends that session, takes its lock again at once and says
    /// so; a claim, which waits for the lock, goes through. Before, it waited for the old
    /// session to go, claiming no run and renewing no lease.
    @Test(.enabled(if: PostgresProcessTests.available))
    func anOldSessionStillHoldingTheEnginesLivenessLockIsEnded() async throws {
        let (server, url) = try await PostgresServer.ofItsOwn(database: "forgotten")
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await PostgresStore.open(url: url, logger: logs.logger(label: "hop.store"))
        let incarnation = store.makeIncarnation(label: "A")
        let key = try #require(AdvisoryLock.key(ofOwner: incarnation.id))
        let until = Date().addingTimeInterval(60)
        #expect(try await store.claim(runID: 1, owner: incarnation.id, until: until) == nil)
        func holders() async throws -> [PostgresProcessTests.LockHolder] {
            try await PostgresProcessTests.livenessLockHolders(on: server, "forgotten")
        }
        let engines = try await holders()
        try #require(engines.count == 1 && engines[0].application == "hop", "\(engines)")

        let old = try await PostgresProcessTests.sessionWaitingForALock(
            running: "SELECT pg_advisory_lock(\(key))", on: server, "forgotten", in: folder)
        defer { old.kill() }
        _ = try await server.psql("SELECT pg_terminate_backend(\(engines[0].pid))", database: "forgotten")
        try await waitUntil("the engine holds its liveness lock again", timeout: .seconds(30)) {
            let now = try await holders()
            return now.count == 1 && now[0].application == "hop" && now[0] != engines[0]
        }
        let said = logs.texts(atLeast: .debug)
        #expect(
            said.contains { $0.contains("ended this engine's earlier session on the server (pid ") }, "\(said)")
        #expect(try await store.claim(runID: 1, owner: incarnation.id, until: until) == nil)
        // The old session is gone, not only its lock (psql learns so at its next statement).
        try await waitUntil("the old session is gone", timeout: .seconds(30)) {
            try await server.psql(
                """
                SELECT count(*) FROM pg_stat_activity
                WHERE application_name = 'psql' AND datname = 'forgotten' AND pid <> pg_backend_pid()
                """,
                database: "forgotten"
            ).trimmingCharacters(in: .whitespacesAndNewlines) == "0"
        }
        withExtendedLifetime(incarnation) {}
        await store.close()
    }
}

/// When each claim of the test above was cancelled, and how long after it ended, and how.
private final class Claims: Sendable {
    private let state = Mutex<(cancelled: [String: ContinuousClock.Instant], ended: [String: (Duration, String)])>(
        ([:], [:]))

    func cancelled(_ name: String) { state.withLock { $0.cancelled[name] = .now } }

    func end(_ name: String, _ outcome: String) {
        state.withLock { state in
            let after = state.cancelled[name].map { ContinuousClock.now - $0 } ?? .zero
            state.ended[name] = (after, outcome)
        }
    }

    var ended: [String: (Duration, String)] { state.withLock { $0.ended } }
}

/// Set once.
private final class Flag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}
