import Foundation
import HopEngine
import HopPostgres
import HopStore
import HopTestSupport
import PostgresNIO
import Synchronization
import Testing

/// How many connections an engine opens to its server: a fleet sizes the server's
/// `max_connections` by it, and before `connection_limit=` each engine could open 22 (PostgresNIO's
/// pool of 20, and two of its own), with nothing to lower it.
@Suite struct PostgresConnectionLimitTests {
    /// An engine whose URL sets `connection_limit=1` executes 30 flows at once to the end, and the
    /// server never sees more than three of its connections: the one of its pool, its liveness
    /// lock's and the one that listens for changes. One is enough: no statement of the store waits
    /// for a second connection while it holds one. Without the limit, the same load opened 22.
    @Test(.enabled(if: PostgresProcessTests.available))
    func anEngineNeverOpensMoreConnectionsThanItsURLAllows() async throws {
        let folder = try TemporaryDirectory()
        let plain = try await TestBackend.postgres.location(folder)  // with ?host=, the server's socket folder
        let url = plain + "&connection_limit=1"
        let store = try await PostgresStore.open(url: url)
        #expect(store.url.connectionLimit == 1 && store.url.redacted.hasSuffix("&connection_limit=1"))
        let events = SettledRuns()
        let engine = HopEngine(
            storage: store, logger: PostgresConnectionLossTests.quiet,
            configuration: .init(observer: events.observe, engineID: "limited"))
        engine.register(
            Flow("work", version: "1") { flow in
                try await flow.hop(to: "first")
                try await flow.markUsed("first")
                try await flow.hop(to: "second")
            })
        engine.register(step: "first") { _ in }
        engine.register(step: "second") { _ in }
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await waitUntil("the engine is ready") { events.ready }

        let admin = try await PostgresConnectionLossTests.connect(plain)
        // Closed whatever happens: a connection left open when a failing test throws ends the
        // whole test process (PostgresNIO asserts that each connection is closed).
        defer { Task { try? await admin.close() } }
        let database = try await admin.query("SELECT current_database()", logger: PostgresConnectionLossTests.quiet)
            .collect().first?.decode(String.self)
        let finished = Mutex(false)
        let counting = Task {
            var most = 0
            while !finished.withLock({ $0 }) {
                let rows = try await admin.query(
                    """
                    SELECT count(*) FROM pg_stat_activity
                    WHERE datname = \(database ?? "") AND application_name = 'hop' AND pid <> pg_backend_pid()
                    """, logger: PostgresConnectionLossTests.quiet
                ).collect()
                most = max(most, Int(try rows.first?.decode(Int64.self) ?? 0))
                await Task.yield()
            }
            return most
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<30 {
                group.addTask { _ = try await engine.start("work", subject: "s\(index)") }
            }
            try await group.waitForAll()
        }
        // Slow on one connection under the whole suite (100 flows took over a minute).
        let completed = Mutex(0)
        do {
            try await waitUntil("every run completed", timeout: .seconds(180)) {
                let runs = try await store.allRuns(flow: "work")
                completed.withLock { $0 = runs.count { $0.status == .completed } }
                return runs.allSatisfy { $0.status == .completed }
            }
        } catch {
            Issue.record("\(completed.withLock { $0 }) of 30 runs completed: \(error)")
            throw error
        }
        finished.withLock { $0 = true }
        let most = try await counting.value
        #expect(most <= 3, "the engine had \(most) connections to the server at once")
        #expect(most >= 2, "the count saw none of the engine's connections: it counts nothing")
        try await admin.close()
    }

    /// `connection_limit=` is read as a whole number of at least 1; anything else is refused with
    /// an error naming the URL (without its password), and a limit below 1 set in code too.
    @Test func aConnectionLimitIsAWholeNumberOfAtLeastOne() async throws {
        let url = try PostgresURL("postgres://hop:s3cret-pw@db.example/fleet?connection_limit=4")
        #expect(url.connectionLimit == 4)
        #expect(url.redacted == "postgres://hop:***@db.example:5432/fleet?connection_limit=4")
        #expect(
            try PostgresURL("postgres://hop@db.example/fleet").connectionLimit == PostgresURL.defaultConnectionLimit)
        for bad in ["0", "-2", "many", "1.5", ""] {
            do {
                _ = try PostgresURL("postgres://hop:s3cret-pw@db.example/fleet?connection_limit=\(bad)")
                Issue.record("connection_limit=\(bad) was accepted")
            } catch let error as HopError {
                #expect(error.code == .invalidInput)
                #expect(!"\(error)".contains("s3cret-pw"), "\(error)")
                #expect("\(error)".contains("connection_limit"), "\(error)")
                #expect(error.hint?.contains("connection_limit=4") == true, "\(error)")
            }
        }
        var none = url
        none.connectionLimit = 0
        do {
            _ = try await PostgresStore.open(url: none)
            Issue.record("a store with no connection was opened")
        } catch let error as HopError {
            #expect(error.code == .invalidInput && error.hint?.contains("connection_limit") == true, "\(error)")
        }
    }
}
