import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A PostgreSQL server of a test's own: `initdb` into a temporary folder, started with `pg_ctl`
/// listening on a Unix socket in that folder only (no TCP port, so tests never collide), and shut
/// down (immediately: it holds nothing to keep) when released. Run as root, the server runs as
/// the `postgres` user, as PostgreSQL requires.
///
/// ``start()`` returns `nil` when PostgreSQL's server programs are not installed, after saying so
/// on standard error; with `CI=true` in the environment a missing server is a failure, never a silent skip.
/// `script/setup` installs Debian's `postgresql`.
public final class PostgresServer: Sendable {
    /// The folder holding the cluster (`data`), its log and its socket.
    public let folder: TemporaryDirectory
    /// The folder of the server's Unix socket: psql's and a client's `host`.
    public var socketDirectory: String { folder.path("") }
    /// The URL of database `name` on this server, for a client (`postgres://postgres@/NAME?host=FOLDER`),
    /// as `role` if one is given (``createRole(_:owning:)``), as the superuser otherwise.
    public func url(database name: String, role: String? = nil) -> String {
        "postgres://\(role ?? user)@/\(name)?host=\(socketDirectory.hasSuffix("/") ? String(socketDirectory.dropLast()) : socketDirectory)"
    }

    /// The pid of the server's postmaster while it runs: the pid heading `postmaster.pid`, if
    /// that process works in this cluster's folder. A server that ended without removing the file
    /// (killed) leaves a pid that any process the suite starts may have taken since.
    public var postmasterPID: pid_t? {
        guard let text = try? String(contentsOfFile: folder.path("data/postmaster.pid"), encoding: .utf8),
            let line = text.split(separator: "\n").first, let pid = pid_t(line)
        else { return nil }
        return Self.process(pid, worksIn: folder.path("data")) ? pid : nil
    }

    /// Whether process `pid` runs with `folder` as its working directory, as a postmaster runs in
    /// its cluster's data folder.
    public static func process(_ pid: pid_t, worksIn folder: String) -> Bool {
        guard let working = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd") else {
            return false
        }
        return URL(fileURLWithPath: working).resolvingSymlinksInPath().path
            == URL(fileURLWithPath: folder).resolvingSymlinksInPath().path
    }

    /// The port in the socket's name (`.s.PGSQL.<port>`); nothing listens on TCP.
    public let port = 5432
    /// The superuser, who may connect over the socket without a password.
    public let user = "postgres"
    private let binaries: String
    private let runAs: [String]
    /// Whether the server syncs its log at every commit.
    private let durable: Bool

    private init(folder: TemporaryDirectory, binaries: String, runAs: [String], durable: Bool) {
        self.folder = folder
        self.binaries = binaries
        self.runAs = runAs
        self.durable = durable
    }

    deinit {
        // pg_ctl's immediate shutdown is SIGQUIT to the postmaster.
        if let pid = postmasterPID { kill(pid, SIGQUIT) }
    }

    /// The folder of PostgreSQL's server programs (Debian: `/usr/lib/postgresql/<major>/bin`,
    /// the newest), or the folder of `pg_ctl` on `PATH`; `nil` when there is none.
    public static func serverBinaries() -> String? {
        let debian = "/usr/lib/postgresql"
        let majors = ((try? FileManager.default.contentsOfDirectory(atPath: debian)) ?? []).compactMap(Int.init)
        for major in majors.sorted(by: >)
        where FileManager.default.isExecutableFile(atPath: "\(debian)/\(major)/bin/pg_ctl") {
            return "\(debian)/\(major)/bin"
        }
        for folder in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":")
        where FileManager.default.isExecutableFile(atPath: "\(folder)/pg_ctl")
            && FileManager.default.isExecutableFile(atPath: "\(folder)/initdb")
        {
            return String(folder)
        }
        return nil
    }

    /// Whether a test must fail rather than skip when PostgreSQL is missing.
    public static var isCI: Bool { ProcessInfo.processInfo.environment["CI"] == "true" }

    /// Starts a server in a new temporary folder; `nil` (said on standard error) when PostgreSQL
    /// is not installed and this is not CI.
    /// With `durable`, the server syncs its log at every commit as a production server does (for
    /// measurements); else it never syncs (tests kill processes, never the machine).
    public static func start(durable: Bool = false) async throws -> PostgresServer? {
        guard let binaries = serverBinaries() else {
            let message =
                "PostgreSQL's server programs (initdb, pg_ctl) are not installed: run script/setup (Debian's postgresql)"
            if isCI { throw TestFailure(message + "; CI=true, so this fails rather than skipping") }
            FileHandle.standardError.write(Data("skipping the PostgreSQL tests: \(message)\n".utf8))
            return nil
        }
        let (folder, runAs) = try clusterFolder()
        let server = PostgresServer(folder: folder, binaries: binaries, runAs: runAs, durable: durable)
        try await server.run(
            "initdb",
            [
                "-D", folder.path("data"), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale",
                "--no-sync",
            ])
        try await server.startAgain()
        return server
    }

    /// A new temporary folder for a cluster, and the prefix of the commands that run the
    /// server's programs. Run as root, the folder is the postgres user's and the programs run as
    /// that user: PostgreSQL refuses to run as root.
    private static func clusterFolder() throws -> (folder: TemporaryDirectory, runAs: [String]) {
        let folder = try TemporaryDirectory()
        guard geteuid() == 0 else { return (folder, []) }
        guard let account = getpwnam("postgres") else {
            throw TestFailure("running as root, but there is no postgres user to run PostgreSQL as: run script/setup")
        }
        guard chown(folder.path(""), account.pointee.pw_uid, account.pointee.pw_gid) == 0 else {
            throw TestFailure(
                "cannot give \(folder.path("")) to the postgres user: \(String(cString: strerror(errno)))")
        }
        return (folder, ["/usr/sbin/runuser", "-u", "postgres", "--"])
    }

    /// A server of a test's own, which it may stop, restart or lock without failing other
    /// tests, with an empty database `name`: the server, and that database's URL. Throws where
    /// ``start(durable:)`` returns `nil` (PostgreSQL is not installed).
    public static func ofItsOwn(database name: String) async throws -> (server: PostgresServer, url: String) {
        guard let server = try await start() else {
            throw TestFailure("PostgreSQL's server programs are not installed: run script/setup")
        }
        try await server.createDatabase(name)
        return (server, server.url(database: name))
    }

    /// A standby of this server, as a failover setup keeps one: a copy of its cluster
    /// (`pg_basebackup -R`, after a checkpoint made at once, not spread over minutes) in a new
    /// folder, started, replaying what this server writes as it writes it (streaming
    /// replication), listening on a socket of its own. ``promote()`` makes it the primary.
    public func standby() async throws -> PostgresServer {
        let (folder, runAs) = try Self.clusterFolder()
        let standby = PostgresServer(folder: folder, binaries: binaries, runAs: runAs, durable: durable)
        try await run(
            "pg_basebackup",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-D", folder.path("data"), "-R", "-X", "stream",
                "-c", "fast",
                "--no-sync",
            ])
        try await standby.startAgain()
        return standby
    }

    /// A physical backup of this server's cluster, as an operator takes one (`pg_basebackup`,
    /// after a checkpoint made at once, with the log it needs), in a new folder: for ``restore(_:)``.
    public func physicalBackup() async throws -> TemporaryDirectory {
        let (backup, _) = try Self.clusterFolder()
        try await run(
            "pg_basebackup",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-D", backup.path("data"), "-X", "stream", "-c",
                "fast", "--no-sync",
            ])
        return backup
    }

    /// Restores `backup` (``physicalBackup()``) under running clients: stops the server at once,
    /// puts the backup's cluster in place of its own, and starts it again on the same socket.
    public func restore(_ backup: TemporaryDirectory) async throws {
        try await stopAtOnce()
        guard rename(folder.path("data"), folder.path("data-before-restore")) == 0,
            rename(backup.path("data"), folder.path("data")) == 0
        else { throw TestFailure("cannot put the backup in place: \(String(cString: strerror(errno)))") }
        try await startAgain()
    }

    /// Makes this standby (``standby()``) the primary, as a failover does; returns once it is.
    public func promote() async throws {
        try await run("pg_ctl", ["-D", folder.path("data"), "-w", "-t", "60", "promote"])
    }

    /// Makes this standby (``standby()``) stop receiving what its primary writes, as a standby
    /// that fell behind would be at a failover: its connection to the primary ends and is not
    /// made again. Returns once it has no connection to the primary.
    public func stopReceiving() async throws {
        try await psql("ALTER SYSTEM SET primary_conninfo = ''")
        try await psql("SELECT pg_reload_conf()")
        try await waitUntil("the standby in \(folder.path("")) no longer receives from its primary") {
            try await self.psql("SELECT count(*) FROM pg_stat_wal_receiver")
                .trimmingCharacters(in: .whitespacesAndNewlines) == "0"
        }
    }

    /// Stops the server at once, as a crash of its machine would, as far as clients can tell:
    /// every connection ends and nothing is checkpointed (`pg_ctl stop -m immediate`).
    public func stopAtOnce() async throws {
        try await run("pg_ctl", ["-D", folder.path("data"), "-m", "immediate", "-w", "-t", "60", "stop"])
    }

    /// How long ago the server started, in seconds, by its own clock.
    public func age() async throws -> Double {
        let text = try await psql("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
        return Double(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }

    /// Starts the server stopped by ``stop()`` (or never started), with its settings; returns once it listens.
    public func startAgain() async throws {
        // Many connections: the whole suite's tests start at once, each with its stores (a liveness
        // lock, a listener and a pool each) and processes; three full local runs peaked at 440,
        // 455 and 467, and a CI run was refused at 500. No fsync unless durable.
        let options =
            "-k \(folder.path("")) -p \(port) -c listen_addresses='' -c max_connections=1200"
            + (durable ? "" : " -c fsync=off")
        try await run(
            "pg_ctl",
            ["-D", folder.path("data"), "-l", folder.path("server.log"), "-w", "-t", "60", "-o", options, "start"])
    }

    /// Stops the server as an operator's `pg_ctl stop` does: every client's connection is ended
    /// (`-m fast`) and nothing listens until ``startAgain()``.
    public func stop() async throws {
        try await run("pg_ctl", ["-D", folder.path("data"), "-m", "fast", "-w", "-t", "60", "stop"])
    }

    /// Restarts the server as an operator's `pg_ctl restart` does: every client's connection is
    /// ended (`-m fast`), and the server listens again, on the same socket, once this returns.
    public func restart() async throws {
        try await run(
            "pg_ctl",
            ["-D", folder.path("data"), "-l", folder.path("server.log"), "-m", "fast", "-w", "-t", "60", "restart"])
    }

    /// Runs `sql` with psql in `database`, stopping at the first error; returns its unaligned
    /// output without headers (one row per line, columns separated by `|`).
    @discardableResult
    public func psql(_ sql: String, database: String = "postgres") async throws -> String {
        try await run(
            "psql",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-d", database, "-X", "-q", "-A", "-t",
                "-v", "ON_ERROR_STOP=1", "-c", sql,
            ])
    }

    /// Runs psql on the SQL file at `path` in `database`, in one transaction, stopping at the first error.
    public func psql(file path: String, database: String = "postgres") async throws {
        try await run(
            "psql",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-d", database, "-X", "-q", "-1",
                "-v", "ON_ERROR_STOP=1", "-f", path,
            ])
    }

    /// A psql session of its own in `database` that has run `sql` (which may begin a
    /// transaction and take locks) and stays in it, holding what it took, until its input is
    /// closed (``ChildProcess/closeInput()``: psql exits, and an open transaction is rolled back)
    /// or it is killed. Returns once `sql` ran.
    public func session(
        running sql: String, database: String, in directory: TemporaryDirectory
    ) async throws -> ChildProcess {
        let marker = "session-ready-\(UUID().uuidString.prefix(8))"
        let session = try client(running: "\(sql);\nSELECT '\(marker)';", database: database, in: directory)
        do {
            try await session.waitForOutput(marker)
        } catch {
            session.kill()
            throw TestFailure("psql did not run \(sql): \(session.stderr)")
        }
        return session
    }

    /// A psql session of its own in `database` that runs `sql` and then waits, as
    /// ``session(running:database:in:)`` does, but returns at once: for a statement that waits
    /// (the test waits for what the server shows of it).
    public func client(
        running sql: String, database: String, in directory: TemporaryDirectory
    ) throws -> ChildProcess {
        try ChildProcess(
            "\(binaries)/psql",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-d", database, "-X", "-q", "-A", "-t",
                "-v", "ON_ERROR_STOP=1",
            ], stdin: "\(sql);\n", keepInputOpen: true, directory: directory)
    }

    /// Backs database `database` up as an operator does, with `pg_dump` (its custom format), into
    /// a new file in the server's folder; returns the file's path, for ``restore(_:into:)``.
    public func dump(database: String) async throws -> String {
        let file = folder.path("\(database)-\(UUID().uuidString.prefix(8)).dump")
        try await run(
            "pg_dump", ["-h", socketDirectory, "-p", "\(port)", "-U", user, "-Fc", "-f", file, database])
        return file
    }

    /// Restores the backup `file` (``dump(database:)``) into database `database` as an operator
    /// who forgot to stop the engines would. By default `pg_restore --clean` drops the tables the
    /// backup holds and creates them again with its rows, in one transaction, while clients stay
    /// connected. `recreating` drops the database first, ending its clients' sessions
    /// (`DROP DATABASE … WITH (FORCE)`), and creates it again, empty, for `pg_restore`.
    public func restore(_ file: String, into database: String, recreating: Bool = false) async throws {
        if recreating {
            try await psql("DROP DATABASE \"\(database)\" WITH (FORCE)")
            try await createDatabase(database)
        }
        try await run(
            "pg_restore",
            [
                "-h", socketDirectory, "-p", "\(port)", "-U", user, "-d", database, "--single-transaction",
                "--exit-on-error",
            ]
                + (recreating ? [] : ["--clean", "--if-exists"]) + [file])
    }

    /// Creates database `name`, empty.
    public func createDatabase(_ name: String) async throws {
        try await psql("CREATE DATABASE \"\(name)\"")
    }

    /// Creates `role`, no superuser, which may connect over the socket without a password, and
    /// gives it database `database` (where it may then create Hop's tables); returns the
    /// database's URL as `role`. A superuser's sessions are out of its reach: it may not end them.
    public func createRole(_ role: String, owning database: String) async throws -> String {
        try await psql("CREATE ROLE \"\(role)\" LOGIN NOSUPERUSER; ALTER DATABASE \"\(database)\" OWNER TO \"\(role)\"")
        return url(database: database, role: role)
    }

    /// Runs one of the server's programs (as the postgres user when root) on a thread of its own;
    /// throws with its standard error when it fails.
    @discardableResult
    private func run(_ program: String, _ arguments: [String]) async throws -> String {
        let command =
            runAs.isEmpty ? ["\(binaries)/\(program)"] + arguments : runAs + ["\(binaries)/\(program)"] + arguments
        let scratch = folder.path("\(program)-\(UUID().uuidString)")
        let result = try await onThread { try spawnAndWait(command[0], Array(command.dropFirst()), scratch: scratch) }
        guard result.status == 0 else {
            let log = (try? String(contentsOfFile: folder.path("server.log"), encoding: .utf8)) ?? ""
            throw TestFailure(
                "\(program) \(arguments.joined(separator: " ")): exit \(result.status): \(result.stderr)\(log.isEmpty ? "" : "\nserver log:\n\(log.suffix(2000))")"
            )
        }
        return result.stdout
    }
}
