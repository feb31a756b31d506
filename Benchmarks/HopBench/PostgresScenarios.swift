import Foundation
import HopEngine
import HopPostgres
import HopStore
import HopStoreTestSupport
import Logging
import PostgresNIO

#if canImport(Glibc)
import Glibc
#endif

/// The scenarios on PostgreSQL, each on a server of its own started in a temporary folder
/// (durable: fsync and synchronous_commit on), on a Unix socket.
///
/// `fleet`: start-up flows per second with 1, 2 and 4 engine processes on one local server, beside
/// one process on a SQLite file; every process keeps 100 runs in flight.
/// `durable-hops-postgres`: hop+unhop pairs of one run through the engine, and the same statements
/// in the same transactions through postgres-nio directly, in alternating rounds.
/// `long-history-postgres`: `long-history` with the run copied to the server (by `hopctl copy`, in
/// a process of its own, so that the copy's memory is not counted) and resumed there.
extension Scenarios {
    func longHistoryPostgres() async throws -> [Figure] {
        guard let server = try await PostgresServer.start(durable: true) else {
            FileHandle.standardError.write(Data("hop-bench: long-history-postgres skipped (see above)\n".utf8))
            return []
        }
        let hopctl = try Self.hopctlExecutable()
        return try await longHistory(prefix: "long-history-postgres") { file, laps in
            let name = "long_history_\(laps)"
            try await server.createDatabase(name)
            try Self.runProcess(hopctl, ["copy", "--from", file, "--to", server.url(database: name)])
            return try await PostgresStore.open(url: server.url(database: name)).database
        }
    }

    /// Flows each worker process runs.
    var fleetFlowsPerProcess: Int { quick ? 40 : 600 }

    func fleet() async throws -> [Figure] {
        var figures = [
            Figure("fleet.sqlite-1.flows", try fleetRound(processes: 1, database: path("fleet.sqlite")), "flows/s")
        ]
        // A server of its own in a temporary folder, durable (fsync on, synchronous_commit on), on a Unix socket.
        guard let server = try await PostgresServer.start(durable: true) else {
            FileHandle.standardError.write(Data("hop-bench: fleet on PostgreSQL skipped (see above)\n".utf8))
            return figures
        }
        for processes in [1, 2, 4] {
            let name = "fleet_\(processes)"
            try await server.createDatabase(name)
            // The schema first, so that the workers' opens race for nothing.
            await (try await PostgresStore.open(url: server.url(database: name))).close()
            figures.append(
                Figure(
                    "fleet.postgres-\(processes).flows",
                    try fleetRound(processes: processes, database: server.url(database: name)), "flows/s"))
        }
        return figures
    }

    /// Starts `processes` workers on `database` at once; the flows of all of them per second of the
    /// span from the first worker's first start to the last one's last completion.
    private func fleetRound(processes: Int, database: String) throws -> Double {
        let children = try (0..<processes).map { index in
            try spawnChild(
                [
                    "--child", "fleet-worker", "--folder", folder.path, "--db", database, "--prefix", "p\(index)",
                    "--count", "\(fleetFlowsPerProcess)",
                ], stdoutPath: path("fleet-\(processes)-\(index).figures"),
                stderrPath: path("fleet-\(processes)-\(index).err"))
        }
        var begins: [Double] = []
        var ends: [Double] = []
        for (index, pid) in children.enumerated() {
            let status = try waitForChild(pid)
            let printed =
                (try? String(contentsOfFile: path("fleet-\(processes)-\(index).figures"), encoding: .utf8)) ?? ""
            guard status == 0 else {
                let message =
                    (try? String(contentsOfFile: path("fleet-\(processes)-\(index).err"), encoding: .utf8)) ?? ""
                throw BenchError("fleet worker \(index) of \(processes) exited with \(status): \(message)")
            }
            for figure in printed.split(separator: "\n").compactMap({ Figure(line: String($0)) }) {
                if figure.name == "fleet-worker.begin" { begins.append(figure.value) }
                if figure.name == "fleet-worker.end" { ends.append(figure.value) }
            }
        }
        guard let begin = begins.min(), let end = ends.max(), begins.count == processes, ends.count == processes else {
            throw BenchError("a fleet worker printed no times")
        }
        return Double(processes * fleetFlowsPerProcess) / ((end - begin) / 1000)
    }

    /// One engine process of the fleet: `count` start-up flows for subjects `prefix-0…`, 100 at a
    /// time; prints when the first started and the last completed (milliseconds since the epoch).
    func fleetWorker(database: String, prefix: String, count: Int) async throws -> [Figure] {
        let opened = try await HopDatabase.open(database)
        let engine = HopEngine(
            database: opened, logger: Self.quiet, configuration: .init(engineID: "hop-bench-\(prefix)"))
        registerStartupFlow(on: engine)
        let begin = Date()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<count {
                if index >= 100 { try await group.next() }
                group.addTask {
                    let run = try await engine.start("startup", subject: "\(prefix)-\(index)")
                    let settled = try await engine.settled(runID: run.id)
                    guard settled?.status == .completed else {
                        throw BenchError("run \(run.id) ended \(settled?.status.rawValue ?? "missing")")
                    }
                }
            }
            try await group.waitForAll()
        }
        let end = Date()
        return [
            Figure("fleet-worker.begin", (begin.timeIntervalSince1970 * 1000).rounded(), "ms"),
            Figure("fleet-worker.end", (end.timeIntervalSince1970 * 1000).rounded(), "ms"),
        ]
    }

    /// The start-up flow of the benchmarks, every step finishing at once.
    func registerStartupFlow(on engine: HopEngine) {
        engine.register(
            Flow("startup", version: "1") { flow in
                try await flow.hop(to: "splash")
                if try await flow.isFirstUse("onboarding") {
                    try await flow.hop(to: "onboarding")
                    try await flow.markUsed("onboarding")
                }
                if try await flow.session() == nil {
                    try await flow.hop(to: "login")
                }
                try await flow.hop(to: "main")
            })
        for step in ["splash", "onboarding", "login", "main"] { engine.register(step: step) { _ in } }
    }
}

extension Scenarios {
    func durableHopsPostgres() async throws -> [Figure] {
        guard let server = try await PostgresServer.start(durable: true) else {
            throw BenchError("PostgreSQL's server programs are not installed: run script/setup")
        }
        let count = quick ? 100 : 2000
        let rounds = 5
        let perRound = count / rounds
        try await server.createDatabase("engine")
        try await server.createDatabase("raw")
        let store = try await PostgresStore.open(url: server.url(database: "engine"))
        let engine = HopEngine(
            database: store.database, logger: Self.quiet, configuration: .init(engineID: "hop-bench"))
        engine.register(
            Flow("loop", version: "1") { flow in
                for _ in 0..<perRound { try await flow.hop(to: "tick") }
            })
        engine.register(step: "tick") { _ in }
        let raw = try await RawPostgresBaseline(url: server.url(database: "raw"))
        var engineSeconds = 0.0
        var rawSeconds = 0.0
        for round in 0..<rounds {
            engineSeconds += try await Measure.seconds {
                let run = try await engine.start("loop", subject: "round-\(round)")
                let settled = try await engine.settled(runID: run.id)
                guard settled?.status == .completed else {
                    throw BenchError("the loop run ended \(settled?.status.rawValue ?? "missing")")
                }
            }
            rawSeconds += try await raw.pairs(perRound)
        }
        await raw.close()
        await store.close()
        let engineRate = Double(perRound * rounds) / engineSeconds
        let rawRate = Double(perRound * rounds) / rawSeconds
        return [
            Figure("durable-hops-postgres.engine", engineRate, "hops/s"),
            Figure("durable-hops-postgres.raw", rawRate, "hops/s"),
            Figure("durable-hops-postgres.ratio", engineRate / rawRate, "x"),
        ]
    }
}

/// The physical baseline of a hop on PostgreSQL: the statements PostgresStore issues for a hop
/// and for an unhop of one run (lock the run's row, append the history entry numbered after the
/// last, update the run), one transaction each, on one postgres-nio connection, no Hop in between.
final class RawPostgresBaseline: Sendable {
    private let client: PostgresClient
    private let running: Task<Void, Never>
    private let logger = Logger(label: "hop-bench", factory: { _ in SwiftLogNoOpLogHandler() })

    init(url: String) async throws {
        await (try await PostgresStore.open(url: url)).close()  // Hop's schema
        let parsed = try PostgresURL(url)
        guard let socket = parsed.socketDirectory else { throw BenchError("the raw baseline expects a socket URL") }
        var configuration = PostgresClient.Configuration(
            unixSocketPath: socket + "/.s.PGSQL.\(parsed.port)", username: parsed.user, password: nil,
            database: parsed.database)
        configuration.options.maximumConnections = 1
        let client = PostgresClient(configuration: configuration)
        self.client = client
        running = Task { await client.run() }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try await client.query(
            "INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at) VALUES ('loop', 'default', '1', 'running', \(now), \(now))",
            logger: logger)
    }

    func close() async {
        running.cancel()
        await running.value
    }

    /// Performs `count` hop+unhop pairs; returns the seconds taken.
    func pairs(_ count: Int) async throws -> Double {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        return try await Measure.seconds {
            for index in 0..<count {
                let token = "token-\(index)"
                try await write(kind: "hop", token: token, now: now, step: "tick")
                try await write(kind: "unhop", token: token, now: now, step: nil)
            }
        }
    }

    private func write(kind: String, token: String, now: Int64, step: String?) async throws {
        try await client.withConnection { connection in
            try await connection.withTransaction(logger: self.logger) { connection in
                let rows = try await connection.query(
                    "SELECT id, status, owner, current_step, current_token FROM runs WHERE id = \(Int64(1)) FOR UPDATE",
                    logger: self.logger
                ).collect()
                guard !rows.isEmpty else { throw BenchError("the raw run is missing") }
                _ = try await connection.query(
                    """
                    INSERT INTO history (run_id, seq, kind, step, token, value, at)
                    SELECT \(Int64(1)), coalesce(max(seq), 0) + 1, \(kind), 'tick', \(token), NULL, \(now)
                    FROM history WHERE run_id = \(Int64(1)) RETURNING seq
                    """, logger: self.logger
                ).collect()
                _ = try await connection.query(
                    "UPDATE runs SET current_step = \(step), current_token = \(step == nil ? nil : token), updated_at = \(now) WHERE id = \(Int64(1))",
                    logger: self.logger
                ).collect()
            }
        }
    }
}
