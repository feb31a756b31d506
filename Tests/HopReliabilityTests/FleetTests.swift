import Foundation
import HopStore
import HopTestSupport
import Testing

/// A fleet of engine processes on one database (a PostgreSQL server's, or one file on one
/// machine), killed at random while runs arrive.
@Suite struct FleetTests {
    /// Three engines with different labels share 300 subjects' start-up flows, started over 20 s;
    /// every 0.5–1 s one engine is SIGKILLed and a new one started (for 20 s, and until 20 were killed). Leases are two minutes long and
    /// every run must be done within one minute of the last kill, so the runs of a killed engine
    /// move on only because its liveness (an advisory lock on the server, a lock on a file
    /// beside the database) went with it.
    @Test(arguments: TestBackend.all)
    func runsOfAFleetKilledAtRandomAllCompleteAndNoStepIsEnteredTwiceWithoutACrash(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let url = try await backend.location(folder)
        let store = try await backend.open(folder)
        var launched = 0
        func launch() throws -> ChildProcess {
            launched += 1
            return try ChildProcess(
                "hop-test-daemon",
                [
                    "--db", url, "--files", folder.database, "--fleet", "--engine-id", "fleet-\(launched)", "--lease",
                    "120",
                ],
                keepInputOpen: true, directory: folder)
        }
        var engines = try (0..<3).map { _ in try launch() }
        var everyEngine = engines
        defer { for engine in everyEngine { engine.kill() } }
        for engine in engines { try await engine.waitForOutput("ready") }

        let subjects = 300
        let period = Duration.seconds(20)
        var killed: Set<Int32> = []
        var started = 0
        let begin = ContinuousClock.now
        var nextKill = begin + .milliseconds(Int.random(in: 500...1000))
        // At least 20 kills, however slow a loaded machine makes this loop: kills go on past the period until then.
        let kills = 20
        func killing() -> Bool { ContinuousClock.now - begin < period || killed.count < kills }
        while killing() || started < subjects {
            // Runs arrive evenly over the period: each new one is claimed by whichever engine hears first.
            let due = min(subjects, Int(Double(subjects) * ((ContinuousClock.now - begin) / period)) + 1)
            while started < due {
                _ = try await store.startRun(flow: "startup", subject: "user-\(started)", version: "1")
                started += 1
            }
            if ContinuousClock.now >= nextKill, killing() {
                let index = Int.random(in: 0..<engines.count)
                killed.insert(engines[index].processIdentifier)
                engines[index].kill()
                _ = try await engines[index].waitForExit()
                engines[index] = try launch()
                everyEngine.append(engines[index])
                nextKill = ContinuousClock.now + .milliseconds(Int.random(in: 500...1000))
            }
            try await Task.sleep(for: .milliseconds(20))  // the pace of arrivals and kills, not a wait for an outcome
        }

        try await waitUntil("every run completed", timeout: .seconds(60)) {
            let runs = try await store.runs(flow: "startup", subject: nil, limit: 1000)
            return runs.count == subjects && runs.allSatisfy { $0.status == .completed }
        }

        // Each step body entered again only after the process that entered it before was killed.
        let lines = try String(contentsOfFile: folder.database + ".bodies", encoding: .utf8).split(separator: "\n")
        var entries: [String: [Int32]] = [:]
        for line in lines {
            let fields = line.split(separator: " ")
            guard fields.count == 3, let pid = Int32(fields[2]) else {
                Issue.record("a malformed body line: \(line)")
                continue
            }
            entries["run \(fields[0]) \(fields[1])", default: []].append(pid)
        }
        var reentered = 0
        for (step, pids) in entries where pids.count > 1 {
            reentered += 1
            for pid in pids.dropLast() where !killed.contains(pid) {
                Issue.record(
                    "\(step) was entered again although process \(pid), which entered it before, was not killed")
            }
        }
        let runs = try await store.runs(flow: "startup", subject: nil, limit: 1000)
        let histories = try await store.histories(runIDs: runs.map(\.id))
        for run in runs {
            let history = histories[run.id] ?? []
            let used = history.filter { $0.kind == .effect && $0.step == "markUsed(onboarding)" }.count
            #expect(used == 1, "run \(run.id) marked onboarding used \(used) times")
            for step in ["splash", "onboarding", "login", "main"] {
                let hops = history.filter { $0.kind == .hop && $0.step == step }.count
                #expect(hops == 1, "run \(run.id) recorded \(hops) hops to \(step)")
                #expect(entries["run \(run.id) \(step)"] != nil, "no body of \(step) ran for run \(run.id)")
            }
        }

        // hopctl on the database agrees.
        let status = try await run("hopctl", ["status", "--flow", "startup", "--json", "--db", url], in: folder)
        #expect(status.status == 0, "\(status.stderr)")
        let shown = try #require(
            try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [[String: Any]])
        #expect(shown.count == subjects && shown.allSatisfy { $0["status"] as? String == "completed" })
        for engine in engines { engine.closeInput() }
        for engine in engines { _ = try await engine.waitForExit() }
        print("fleet: \(killed.count) engines killed, \(reentered) steps entered again after a kill")
    }
}
