import Foundation
import HopStore
import HopTestSupport
import Testing

/// A daemon executing 1,000 runs while four operators steer it with hopctl: 10,000 commands,
/// bounded in count and time. (HOP_SOAK_COMMANDS sets another count: fewer subjects below
/// 10,000, more cycles above.)
@Suite struct SoakTests {
    static let workers = 4
    static let niceness: Int32 = 10

    /// What each worker does to each of its subjects after unhopping its onboarding: it ends
    /// logged in, so every run must end parked at main.
    static let rounds = [
        ["status"], ["session", "login", "alice"], ["history"], ["session", "logout"],
        ["reset-first-use", "onboarding"],
        ["session", "login", "alice"], ["status"], ["session", "logout"], ["session", "login", "alice"],
    ]

    @Test func fourHopctlOperatorsAndADaemonWith1000RunsLoseNoUnhopAndApplyNoneTwice() async throws {
        let folder = try TemporaryDirectory()
        let budget = Int(ProcessInfo.processInfo.environment["HOP_SOAK_COMMANDS"] ?? "") ?? 10_000
        // Each subject takes 10 commands a cycle: 1,000 subjects for 10,000 commands, fewer for a
        // smaller budget, more cycles for a larger one.
        let subjects = min(1000, max(Self.workers * 10, budget / 10))
        let cycles = max(1, (budget / subjects - 1) / Self.rounds.count)
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute", "--subjects", "\(subjects)"],
            keepInputOpen: true, directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("started \(subjects)", timeout: .seconds(120))
        let hopctl = builtProduct("hopctl")
        let database = folder.database

        let results = try await withThrowingTaskGroup(of: (commands: Int, busy: Int).self) { group in
            for worker in 0..<Self.workers {
                group.addTask {
                    let mine = stride(from: worker, to: subjects, by: Self.workers).map { "user-\($0)" }
                    var plan = mine.map { ["unhop", "--flow", "startup", "--step", "onboarding", "--subject", $0] }
                    for _ in 0..<cycles {
                        for round in Self.rounds {
                            plan += mine.map {
                                round + ["--subject", $0]
                                    + (round == ["status"] || round == ["history"] ? ["--flow", "startup"] : [])
                            }
                        }
                    }
                    let commands = plan
                    // Each operator is a thread of its own that starts hopctl, waits for it, and goes on.
                    // The operators' 10,000 processes are most of the suite's work: they run at a
                    // lower priority (nice 10) than the other processes tests start (5), a load in
                    // the background of the whole suite, so that the tests beside them that wait
                    // for something with a deadline get the processors first. The daemon they
                    // steer runs at 5, as the others.
                    let busy = try await onThread { () throws -> Int in
                        lowerThisThreadsPriority(to: Self.niceness)
                        var busy = 0
                        for arguments in commands {
                            busy += try hopctlRetryingBusy(
                                hopctl, arguments, database: database, scratch: folder.path("worker-\(worker)"))
                        }
                        return busy
                    }
                    return (commands.count, busy)
                }
            }
            return try await group.reduce(into: [(commands: Int, busy: Int)]()) { $0.append($1) }
        }
        #expect(results.map(\.commands).reduce(0, +) >= min(budget, 10_000))

        let store = try await HopStore.open(path: folder.database)
        try await waitUntil("every run is parked at main", timeout: .seconds(120)) {
            try await store.runs(flow: "startup", limit: subjects).allSatisfy {
                $0.status == .parked && $0.currentStep == "main"
            }
        }
        for run in try await store.runs(flow: "startup", limit: subjects) {
            let history = try await store.history(runID: run.id)
            #expect(history.map(\.seq) == Array(1...Int64(history.count)), "run \(run.id): sequence numbers")
            #expect(
                history.filter { $0.kind == .unhop && $0.step == "onboarding" }.count == 1,
                "run \(run.id): onboarding unhops")
            let ends = history.filter { $0.kind.endsStep }.compactMap(\.token)
            #expect(Set(ends).count == ends.count, "run \(run.id): a hop ended twice")
            let hops = Set(history.filter { $0.kind == .hop }.compactMap(\.token))
            #expect(Set(ends).isSubset(of: hops), "run \(run.id): an end without its hop")
            #expect(
                history.filter { $0.kind == .reroute }.count <= 2 * cycles, "run \(run.id): more re-routes than logouts"
            )
        }
        #expect(try await store.integrityCheck() == ["ok"])

        daemon.closeInput()
        #expect(try await daemon.waitForExit(timeout: .seconds(60)) == 0)
        #expect(daemon.stdout.contains("stopped"))
        #expect(daemon.stderr.isEmpty, "the daemon logged errors: \(daemon.stderr.prefix(2000))")
    }
}
