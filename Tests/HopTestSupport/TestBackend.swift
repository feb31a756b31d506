import Foundation
import HopEngine
import HopPostgres
import HopStoreTestSupport
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A storage backend the engine's tests run against: the engine suite is parameterised over
/// ``all``, so every backend passes the same tests (`@Test(arguments: TestBackend.all)`).
package struct TestBackend: Sendable, CustomStringConvertible {
    /// The backend's name, shown in test names.
    package let name: String
    /// Opens a fresh storage whose data lives in `folder` (or, for a server, in a database made for it).
    package let open: @Sendable (_ folder: TemporaryDirectory) async throws -> any HopAdministration
    /// Where a fresh test's data lives, for a process or a second store to open: the database file
    /// in `folder`, or the URL of the test's database on the server (one per folder).
    package let location: @Sendable (_ folder: TemporaryDirectory) async throws -> String

    package var description: String { name }

    /// One SQLite file (`HopStore`).
    package static let sqlite = TestBackend(
        name: "sqlite", open: { folder in try await HopStore.open(path: folder.database) },
        location: { folder in folder.database })

    /// A PostgreSQL server this test process started (`PostgresStore`): a database per test
    /// folder, so that every store a test opens on its folder sees the same data.
    package static let postgres = TestBackend(
        name: "postgres",
        open: { folder in try await PostgresStore.open(url: try await TestDatabases.shared.url(for: folder)) },
        location: { folder in try await TestDatabases.shared.url(for: folder) })

    /// Every backend the engine's tests run against: PostgreSQL too where its server programs are
    /// installed (`script/setup`), and always in CI (`CI=true`), where a missing PostgreSQL fails.
    package static let all: [TestBackend] = {
        if PostgresServer.serverBinaries() != nil || PostgresServer.isCI { return [.sqlite, .postgres] }
        FileHandle.standardError.write(
            Data(
                "skipping the PostgreSQL backend in the engine tests: PostgreSQL's server programs are not installed (run script/setup)\n"
                    .utf8))
        return [.sqlite]
    }()
}

/// The PostgreSQL server of this test process, started on first use and shut down when the
/// process exits, and a new database on it for each test that asks.
package actor TestDatabases {
    package static let shared = TestDatabases()

    private var server: Task<PostgresServer, any Error>?
    private var made = 0
    private var databases: [String: Task<String, any Error>] = [:]
    private var names: [String: String] = [:]

    /// The URL of the database of the test whose folder is `folder`, created empty on first use.
    package func url(for folder: TemporaryDirectory) async throws -> String {
        let key = folder.path("")
        if let database = databases[key] { return try await database.value }
        made += 1
        let name = "hop_test_\(made)"
        names[key] = name
        let creating = Task {
            let server = try await started()
            try await server.createDatabase(name)
            return server.url(database: name)
        }
        databases[key] = creating
        return try await creating.value
    }

    /// Runs `sql` with `psql` on the database of the test whose folder is `folder` (created empty
    /// first if it is not yet): data a test writes in bulk, faster than through a store.
    @discardableResult
    package func psql(_ sql: String, in folder: TemporaryDirectory) async throws -> String {
        try await started().psql(sql, database: try await name(for: folder))
    }

    /// Backs up the database of the test whose folder is `folder` with `pg_dump`
    /// (``PostgresServer/dump(database:)``); returns the backup's path.
    package func dump(in folder: TemporaryDirectory) async throws -> String {
        try await started().dump(database: try await name(for: folder))
    }

    /// Restores `backup` (``dump(in:)``) into the database of the test whose folder is `folder`:
    /// with `pg_restore --clean` while its clients stay connected, or into the database dropped
    /// (its clients' sessions ended) and created again (``PostgresServer/restore(_:into:recreating:)``).
    package func restore(_ backup: String, in folder: TemporaryDirectory, recreating: Bool = false) async throws {
        try await started().restore(backup, into: try await name(for: folder), recreating: recreating)
    }

    /// The name of the database of the test whose folder is `folder`, created empty first if it is not yet.
    private func name(for folder: TemporaryDirectory) async throws -> String {
        _ = try await url(for: folder)
        return names[folder.path("")] ?? ""
    }

    /// The server, started by the first caller; the others wait for it.
    private func started() async throws -> PostgresServer {
        if let server { return try await server.value }
        let starting = Task { try await Self.start() }
        server = starting
        return try await starting.value
    }

    private static func start() async throws -> PostgresServer {
        guard let started = try await PostgresServer.start() else {
            throw TestFailure("PostgreSQL's server programs are not installed: run script/setup")
        }
        if let pid = started.postmasterPID {
            Shutdown.postmaster.store(pid, ordering: .relaxed)
            Shutdown.folder.withLock { $0 = started.folder.path("") }
            atexit {
                // A static's deinit never runs: the server stops with the process, and its folder goes.
                let pid = Shutdown.postmaster.load(ordering: .relaxed)
                guard pid > 0, let folder = Shutdown.folder.withLock({ $0 }) else { return }
                // Only while the pid is still the server's: a server that died early left it to any process.
                if PostgresServer.process(
                    pid, worksIn: URL(fileURLWithPath: folder).appendingPathComponent("data").path)
                {
                    kill(pid, SIGQUIT)
                    // The postmaster is not this process's child: it is gone when signals no longer reach it.
                    var waited = 0
                    while kill(pid, 0) == 0 && waited < 500 {
                        usleep(10_000)
                        waited += 1
                    }
                }
                try? FileManager.default.removeItem(atPath: folder)
            }
        }
        return started
    }
}

/// What the exit handler stops and removes.
private enum Shutdown {
    static let postmaster = Atomic<Int32>(0)
    static let folder = Mutex<String?>(nil)
}
