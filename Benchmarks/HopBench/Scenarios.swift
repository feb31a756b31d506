import Foundation
import HopEngine
import HopStore
import Logging
import Synchronization

/// The benchmark's scenarios. Each runs in its own process (see `HopBench`) and returns its figures.
struct Scenarios {
    let folder: URL
    let quick: Bool

    static let quiet = Logger(label: "hop-bench", factory: { _ in SwiftLogNoOpLogHandler() })

    func path(_ name: String) -> String { folder.appendingPathComponent(name).path }

    func run(_ name: String) async throws -> [Figure] {
        switch name {
        case "durable-hops": try await durableHops(durability: .full, prefix: name)
        case "durable-hops-normal": try await durableHops(durability: .normal, prefix: name)
        case "concurrent-hops": try await concurrentHops()
        case "startup-flow": try await startupFlow(durability: .full, prefix: name)
        case "startup-flow-normal": try await startupFlow(durability: .normal, prefix: name)
        case "resume": try await resume()
        case "long-history": try await longHistory()
        case "long-history-postgres": try await longHistoryPostgres()
        case "hopctl": try await hopctl()
        case "parked-memory": try await parkedMemory()
        case "parked-memory-restart": try await parkedMemoryRestart()
        case "fleet": try await fleet()
        case "durable-hops-postgres": try await durableHopsPostgres()
        default:
            throw BenchError(
                "no scenario is named '\(name)'; the scenarios are \(HopBench.scenarios.joined(separator: ", "))")
        }
    }

    private func engine(_ store: HopStore) -> HopEngine {
        HopEngine(store: store, logger: Self.quiet, configuration: .init(engineID: "hop-bench"))
    }

    // MARK: durable-hops

    /// Runs perform hop+unhop pairs through HopEngine, then the same statements in the same
    /// transactions go through the raw C API; in five alternating rounds, so that both see
    /// the same disk and machine.
    private func durableHops(durability: HopStore.Durability, prefix: String) async throws -> [Figure] {
        let count = durability == .full ? (quick ? 100 : 2000) : (quick ? 1000 : 20000)
        let rounds = 5
        let perRound = count / rounds
        let store = try await Fixtures.hopDatabase(path("\(prefix)-engine.sqlite"), durability: durability)
        let engine = engine(store)
        engine.register(
            Flow("loop", version: "1") { flow in
                for _ in 0..<perRound { try await flow.hop(to: "tick") }
            })
        engine.register(step: "tick") { _ in }
        let raw = try await RawBaseline(path: path("\(prefix)-raw.sqlite"), durability: durability)
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
        let engineRate = Double(perRound * rounds) / engineSeconds
        let rawRate = Double(perRound * rounds) / rawSeconds
        return [
            Figure("\(prefix).engine", engineRate, "hops/s"),
            Figure("\(prefix).raw", rawRate, "hops/s"),
            Figure("\(prefix).ratio", engineRate / rawRate, "x"),
        ]
    }

    // MARK: concurrent-hops

    /// 1,000 runs of a two-step flow hop at once in one engine.
    private func concurrentHops() async throws -> [Figure] {
        let runs = quick ? 200 : 1000
        let store = try await Fixtures.hopDatabase(path("concurrent.sqlite"))
        let engine = engine(store)
        engine.register(
            Flow("pair", version: "1") { flow in
                try await flow.hop(to: "first")
                try await flow.hop(to: "second")
            })
        engine.register(step: "first") { _ in }
        engine.register(step: "second") { _ in }
        let before = await store.commitStatistics
        let seconds = try await Measure.seconds {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<runs {
                    group.addTask {
                        let run = try await engine.start("pair", subject: "device-\(index)")
                        let settled = try await engine.settled(runID: run.id)
                        guard settled?.status == .completed else {
                            throw BenchError("run \(run.id) ended \(settled?.status.rawValue ?? "missing")")
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        let after = await store.commitStatistics
        let rawSeconds = try await RawBaseline(path: path("concurrent-raw.sqlite"), durability: .full).pairs(
            quick ? 50 : 300)
        let rate = Double(runs * 2) / seconds
        let rawRate = Double(quick ? 50 : 300) / rawSeconds
        return [
            Figure("concurrent-hops.engine", rate, "hops/s"),
            Figure("concurrent-hops.raw-single-run", rawRate, "hops/s"),
            Figure("concurrent-hops.ratio", rate / rawRate, "x"),
            Figure(
                "concurrent-hops.writes-per-commit",
                Double(after.writes - before.writes) / Double(max(1, after.transactions - before.transactions)),
                "writes"),
        ]
    }

    // MARK: startup-flow

    /// The demo's start-up flow, every step finishing at once, for many subjects: one after
    /// another, then 100 at a time.
    private func startupFlow(durability: HopStore.Durability, prefix: String) async throws -> [Figure] {
        let sequential = durability == .full ? (quick ? 20 : 300) : (quick ? 200 : 3000)
        let concurrent = durability == .full ? (quick ? 200 : 3000) : (quick ? 500 : 10000)
        let store = try await Fixtures.hopDatabase(path("\(prefix).sqlite"), durability: durability)
        let engine = engine(store)
        registerStartupFlow(on: engine)
        @Sendable func flow(_ subject: String) async throws {
            let run = try await engine.start("startup", subject: subject)
            let settled = try await engine.settled(runID: run.id)
            guard settled?.status == .completed else {
                throw BenchError("run \(run.id) ended \(settled?.status.rawValue ?? "missing")")
            }
        }
        // The floor: the same facts by hand, one transaction per step boundary, on the same disk.
        // The engine and the floor take turns, a tenth of the flows at a time: a disk whose
        // fsyncs slow down or speed up during the scenario moves both sides alike.
        let raw = try await RawStartupFlow(path: path("\(prefix)-raw.sqlite"), durability: durability)
        var sequentialSeconds = 0.0
        var rawSeconds = 0.0
        let rounds = 10
        for round in 0..<rounds {
            let flows = (sequential * round / rounds)..<(sequential * (round + 1) / rounds)
            sequentialSeconds += try await Measure.seconds {
                for index in flows { try await flow("sequential-\(index)") }
            }
            rawSeconds += try await raw.flows(flows, prefix: "sequential")
        }
        let concurrentSeconds = try await Measure.seconds {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<concurrent {
                    if index >= 100 { try await group.next() }
                    group.addTask { try await flow("concurrent-\(index)") }
                }
                try await group.waitForAll()
            }
        }
        let hopsPerFlow = 4.0
        return [
            Figure("\(prefix).sequential.flows", Double(sequential) / sequentialSeconds, "flows/s"),
            Figure("\(prefix).sequential.hops", Double(sequential) * hopsPerFlow / sequentialSeconds, "hops/s"),
            Figure("\(prefix).sequential.raw", Double(sequential) / rawSeconds, "flows/s"),
            Figure("\(prefix).sequential.ratio", rawSeconds / sequentialSeconds, "x"),
            Figure("\(prefix).concurrent-100.flows", Double(concurrent) / concurrentSeconds, "flows/s"),
            Figure("\(prefix).concurrent-100.hops", Double(concurrent) * hopsPerFlow / concurrentSeconds, "hops/s"),
        ]
    }

    // MARK: resume

    /// An engine starts on a database of 100,000 unfinished runs, each in flight at one of ten
    /// steps; how long until every run has re-entered its step, and the memory that took. First,
    /// the floor: the same database work by hand on another copy (``RawResume``).
    private func resume() async throws -> [Figure] {
        let runs = quick ? 5000 : 100_000
        let database = path("resume.sqlite")
        let rawDatabase = path("resume-raw.sqlite")
        for path in [rawDatabase, database] {
            _ = try await Fixtures.hopDatabase(path)
            try Fixtures.writeChainRuns(runs, to: path)
        }
        let inFlight = HopEngine.Configuration().maxConcurrentRuns
        let floor = try await RawResume(path: rawDatabase).resume(runs: runs, inFlight: inFlight)
        guard floor.completed == max(0, runs - inFlight) else {
            throw BenchError("the raw resume completed \(floor.completed) runs")
        }
        let entered = Atomic<Int>(0)
        let before = Measure.memory().resident
        Measure.resetPeakMemory()
        var service: Task<Void, any Error>?
        let seconds = try await Measure.seconds {
            let engine = engine(try await HopStore.open(path: database))
            engine.register(
                Flow("chain", version: "1") { flow in
                    // The run ends after the first step it executes rather than replays: the step
                    // in flight at the crash, entered again.
                    for step in Fixtures.chainSteps {
                        try await flow.hop(to: step)
                        if !flow.isReplaying { return }
                    }
                })
            for step in Fixtures.chainSteps {
                // Entered again once the run has a place (at most `maxConcurrentRuns`, 10,000, at
                // once), it ends at once, and its run completes and gives the place up.
                engine.register(step: step) { context in
                    if context.isReentry { entered.add(1, ordering: .relaxed) }
                }
            }
            service = Task { try await engine.run() }
            try await Measure.waitUntil("every run re-entered its step") { entered.load(ordering: .relaxed) >= runs }
        }
        let memory = Measure.memory()
        _ = service
        return [
            Figure("resume.runs", Double(runs), "runs"),
            Figure("resume.seconds", seconds, "s"),
            Figure("resume.rate", Double(runs) / seconds, "runs/s"),
            Figure("resume.raw-seconds", floor.seconds, "s"),
            Figure("resume.ratio", floor.seconds / seconds, "x"),
            Figure("resume.peak-memory", memory.peak, "MiB"),
            Figure("resume.memory-before", before, "MiB"),
        ]
    }

    // MARK: long-history

    /// One run that went round a loop many times (a hop and an unhop each lap), resumed: how long
    /// its replay takes and what memory it needs, by the length of its history.
    private func longHistory() async throws -> [Figure] {
        try await longHistory(prefix: "long-history") { file, _ in try await HopStore.open(path: file).database }
    }

    /// `long-history` with the run resumed by `open(file, laps)`: the database the run, written
    /// to `file`, is resumed from (what it takes to open is not measured).
    func longHistory(
        prefix: String, open: (_ file: String, _ laps: Int) async throws -> HopDatabase
    ) async throws -> [Figure] {
        var figures: [Figure] = []
        for laps in quick ? [10_000] : [10_000, 100_000, 500_000] {
            let file = path("\(prefix)-\(laps).sqlite")
            _ = try await Fixtures.hopDatabase(file)
            try Fixtures.writeLoopRun(laps: laps, to: file)
            let database = try await open(file, laps)
            Measure.releaseFreeMemory()
            let before = Measure.memory().resident
            Measure.resetPeakMemory()
            let entered = Atomic<Bool>(false)
            let engine = HopEngine(database: database, logger: Self.quiet, configuration: .init(engineID: "hop-bench"))
            engine.register(
                Flow("loop", version: "1") { flow in
                    while true { try await flow.hop(to: "tick") }
                })
            engine.register(step: "tick") { context in
                if context.isReentry { entered.store(true, ordering: .relaxed) }
                try await Task.sleep(for: .seconds(3600))
            }
            let service = Task { try await engine.run() }
            let seconds = try await Measure.seconds {
                try await Measure.waitUntil("the looping run re-entered its step") { entered.load(ordering: .relaxed) }
            }
            let memory = Measure.memory()
            service.cancel()
            _ = try? await service.value
            figures += [
                Figure("\(prefix).\(laps).seconds", seconds, "s"),
                Figure("\(prefix).\(laps).peak-memory", memory.peak - before, "MiB"),
            ]
        }
        return figures
    }

    // MARK: hopctl

    /// `hopctl status` and `hopctl history` of one run, and `hopctl graph` of the whole flow (every
    /// hop of every run read), as processes on a database of 1,000,000 history rows.
    private func hopctl() async throws -> [Figure] {
        let runs = quick ? 5000 : 100_000
        let repeats = quick ? 5 : 20
        let graphRepeats = quick ? 3 : 5
        let database = path("hopctl.sqlite")
        _ = try await Fixtures.hopDatabase(database)
        try Fixtures.writeChainRuns(runs, to: database)
        let rows = try RawSQLite(path: database, synchronous: "NORMAL").run("SELECT count(*) FROM history") ?? 0
        let executable = try Self.hopctlExecutable()
        let subject = "subject-\(runs / 2 + 9)"  // in flight at its last step: the longest history
        var figures = [Figure("hopctl.history-rows", Double(rows), "rows")]
        for (name, arguments, repeats) in [
            ("status", ["status", "--flow", "chain", "--subject", subject, "--db", database], repeats),
            ("history", ["history", "--flow", "chain", "--subject", subject, "--db", database], repeats),
            ("graph", ["graph", "--flow", "chain", "--db", database], graphRepeats),
        ] {
            var times: [Double] = []
            for attempt in 0...repeats {
                let seconds = try await Measure.seconds { try Self.runProcess(executable, arguments) }
                if attempt > 0 { times.append(seconds * 1000) }  // the first run warms the page cache
            }
            times.sort()
            figures.append(Figure("hopctl.\(name).median", times[times.count / 2], "ms"))
        }
        return figures
    }

    /// A daemon started on the database of 100,000 parked runs that `parkedMemory` left: its
    /// peak memory once it has resumed (nothing: parked runs stay in the database) and polled.
    private func parkedMemoryRestart() async throws -> [Figure] {
        let store = try await HopStore.open(path: path("parked.sqlite"), options: .init(durability: .normal))
        let ready = Atomic<Bool>(false)
        let engine = HopEngine(
            store: store, logger: Self.quiet,
            configuration: .init(
                observer: { event in if case .ready = event { ready.store(true, ordering: .relaxed) } },
                engineID: "hop-bench"))
        engine.register(Flow("park", version: "1") { flow in try await flow.hop(to: "wait") })
        engine.register(step: "wait", .external)
        let service = Task { try await engine.run() }
        try await Measure.waitUntil("the engine is ready") { ready.load(ordering: .relaxed) }
        try await Task.sleep(for: .milliseconds(200))  // a few polls of the database
        let memory = Measure.memory()
        service.cancel()
        _ = await service.result
        return [Figure("parked-memory.restarted-peak", memory.peak, "MiB")]
    }

    /// Runs one scenario in a process of its own and returns its figures.
    static func runScenarioProcess(_ name: String, folder: URL, quick: Bool = false) throws -> [Figure] {
        let output = folder.appendingPathComponent("\(name).figures").path
        let errors = folder.appendingPathComponent("\(name).err").path
        let status = try spawnAndWait(
            executablePath, ["--child", name, "--folder", folder.path] + (quick ? ["--quick"] : []),
            stdoutPath: output, stderrPath: errors)
        let printed = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        guard status == 0 else {
            let message = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw BenchError("the scenario \(name) exited with \(status): \(message)")
        }
        return printed.split(separator: "\n").compactMap { Figure(line: String($0)) }
    }

    static var executablePath: String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    /// The `hopctl` built beside hop-bench.
    static func hopctlExecutable() throws -> String {
        let executable = URL(fileURLWithPath: executablePath).deletingLastPathComponent().appendingPathComponent(
            "hopctl"
        ).path
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw BenchError("hopctl is not built beside hop-bench (\(executable)); run `swift build -c release` first")
        }
        return executable
    }

    static func runProcess(_ executable: String, _ arguments: [String]) throws {
        let errors = FileManager.default.temporaryDirectory.appendingPathComponent("hop-bench-\(getpid()).err").path
        defer { try? FileManager.default.removeItem(atPath: errors) }
        let status = try spawnAndWait(executable, arguments, stdoutPath: nil, stderrPath: errors)
        guard status == 0 else {
            let message = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw BenchError("\(executable) \(arguments.joined(separator: " ")) failed: \(message)")
        }
    }

    // MARK: parked-memory

    /// An engine starts 100,000 runs, 100 at a time, that park on an external step; its memory
    /// once they are parked: resident, peak, and resident once malloc returned its free memory.
    private func parkedMemory() async throws -> [Figure] {
        let runs = quick ? 5000 : 100_000
        let store = try await Fixtures.hopDatabase(path("parked.sqlite"), durability: .normal)
        let engine = engine(store)
        engine.register(Flow("park", version: "1") { flow in try await flow.hop(to: "wait") })
        engine.register(step: "wait", .external)
        let service = Task { try await engine.run() }
        let before = Measure.memory().resident
        Measure.resetPeakMemory()
        let seconds = try await Measure.seconds {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<runs {
                    if index >= 100 { try await group.next() }
                    group.addTask { _ = try await engine.start("park", subject: "device-\(index)") }
                }
                try await group.waitForAll()
            }
            try await Measure.waitUntil("every run parked") { await engine.executingCount == 0 }
        }
        // The engine's memory, taken before the check below reads anything: the check counts in
        // SQL, where reading 100,000 records would add some 40 MiB of hop-bench's own to the peak.
        let memory = Measure.memory()
        Measure.releaseFreeMemory()
        let trimmed = Measure.memory()
        let parked =
            try RawSQLite(path: path("parked.sqlite"), synchronous: "NORMAL").run(
                "SELECT count(*) FROM runs WHERE flow = 'park' AND status = 'parked'") ?? 0
        guard parked == runs else { throw BenchError("\(parked) of \(runs) runs parked") }
        service.cancel()
        _ = await service.result
        // A daemon restarted on that database: its own process, so that its peak is its own.
        let restarted = try Self.runScenarioProcess("parked-memory-restart", folder: folder)
        return restarted + [
            Figure("parked-memory.runs", Double(runs), "runs"),
            Figure("parked-memory.resident", memory.resident, "MiB"),
            Figure("parked-memory.resident-trimmed", trimmed.resident, "MiB"),
            Figure("parked-memory.peak", memory.peak, "MiB"),
            Figure("parked-memory.memory-before", before, "MiB"),
            Figure("parked-memory.park-rate", Double(runs) / seconds, "runs/s"),
        ]
    }
}

/// The physical baseline of a hop: the statements of hop+unhop pairs of one run, as HopStore
/// issues them, one transaction each (read the run, read the last sequence number, append
/// the history entry, update the run), through the raw C API with prepared statements.
final class RawBaseline {
    private let raw: RawSQLite
    private var pairsDone = 0

    init(path: String, durability: HopStore.Durability) async throws {
        _ = try await Fixtures.hopDatabase(path, durability: durability)
        raw = try RawSQLite(path: path, synchronous: durability == .full ? "FULL" : "NORMAL")
        try raw.run(
            "INSERT INTO runs (id, flow, subject, flow_version, status, created_at, updated_at) VALUES (1, 'loop', 'default', '1', 'running', ?1, ?1)",
            [.integer(Int64(Date().timeIntervalSince1970 * 1000))])
    }

    /// Performs `count` hop+unhop pairs; returns the seconds taken.
    func pairs(_ count: Int) async throws -> Double {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let first = pairsDone
        pairsDone += count
        return try await Measure.seconds {
            for index in first..<(first + count) {
                let token = "token-\(index)"
                try write(
                    "hop", token: token, now: now,
                    update:
                        "UPDATE runs SET current_step = 'tick', current_token = ?2, status = 'running', updated_at = ?3 WHERE id = ?1",
                    [.integer(1), .text(token), .integer(now)])
                try write(
                    "unhop", token: token, now: now,
                    update:
                        "UPDATE runs SET current_step = NULL, current_token = NULL, status = 'running', updated_at = ?2 WHERE id = ?1",
                    [.integer(1), .integer(now)])
            }
        }
    }

    private func write(_ kind: String, token: String, now: Int64, update: String, _ values: [RawSQLite.Value]) throws {
        try raw.execute("BEGIN IMMEDIATE")
        guard try raw.run("SELECT id FROM runs WHERE id = ?1 AND status = 'running'", [.integer(1)]) != nil else {
            throw BenchError("the raw run is missing")
        }
        let seq = try raw.run("SELECT coalesce(max(seq), 0) FROM history WHERE run_id = ?1", [.integer(1)]) ?? 0
        try raw.run(
            "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, 'tick', ?4, NULL, ?5)",
            [.integer(1), .integer(seq + 1), .text(kind), .text(token), .integer(now)])
        try raw.run(update, values)
        try raw.execute("COMMIT")
    }
}
