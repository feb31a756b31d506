import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryLogging
import Synchronization
import Testing

/// The engine executing a run names, with each write, the last history entry it read or
/// recorded; the store refuses the write, changing nothing, unless the run's history ends
/// there. (The engine's reaction, executing the run again from the database, is tested with a
/// real failover in `PostgresFailoverTests`.)
@Suite struct HistoryFenceTests {
    @Test(arguments: TestBackend.all)
    func aWriteThatFollowsAnotherEntryThanTheLastIsRefusedAndChangesNothing(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.record(
            .hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil),
            runID: run.id, following: 0)
        let token = try #require(hop.token)
        #expect(hop.seq == 1)

        // Behind the history (it holds an entry the writer never saw) and ahead of it (the
        // writer's last entries are not there), alone and as the first of several writes.
        for following: Int64 in [0, 3] {
            for writes: [RunWrite] in [
                [.decision(name: "isFirstUse(onboarding)", value: "true")],
                [.unhop(token: token, output: nil), .markUsed(feature: "onboarding")],
                [.unhop(token: token, output: nil), .decision(name: "a", value: "1"), .complete],
            ] {
                let refused = await #expect(throws: HopError.self) {
                    try await store.record(writes, runID: run.id, owner: nil, following: following, durability: .now)
                }
                #expect(refused?.code == .refused)
                #expect(
                    refused?.reason.contains("ends at entry 1, not at entry \(following)") == true,
                    "\(refused.map { "\($0)" } ?? "")")
            }
        }
        #expect(try await store.history(runID: run.id).map(\.seq) == [1])
        #expect(try await store.run(id: run.id)?.currentToken == token)
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding"))

        // Following the last entry: written, and each later write of the batch follows the one before.
        let entries = try await store.record(
            [.unhop(token: token, output: nil), .markUsed(feature: "onboarding"), .decision(name: "a", value: "1")],
            runID: run.id, owner: nil, following: 1, durability: .now)
        #expect(entries.map(\.seq) == [2, 3, 4])
        #expect(try await store.record(.complete, runID: run.id, following: 4).seq == 5)
        #expect(try await store.run(id: run.id)?.status == .completed)
    }

    /// The same fence holds for the records that end a run's execution: a step's error (each
    /// attempt's and the last, which fails the run) and a divergence. A run is not failed or
    /// marked diverged on a history the database no longer holds.
    @Test(arguments: TestBackend.all)
    func anErrorOrADivergenceThatFollowsAnotherEntryThanTheLastIsRefusedAndChangesNothing(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        var runs: [Int64] = []
        for subject in ["errors", "divergence"] {
            let (run, _) = try await store.startRun(flow: "startup", subject: subject, version: "1")
            try await store.record(
                .hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil), runID: run.id, following: 0)
            runs.append(run.id)
        }
        let ends: [(String, @Sendable (Int64, Int64) async throws -> HistoryEntry)] = [
            (
                "error",
                { run, following in
                    try await store.recordError(
                        runID: run, step: "splash", message: "e", final: false, owner: nil, following: following)
                }
            ),
            (
                "fail",
                { run, following in
                    try await store.recordError(
                        runID: run, step: "splash", message: "e", final: true, owner: nil, following: following)
                }
            ),
            (
                "diverge",
                { run, following in
                    try await store.divergeRun(runID: run, step: nil, message: "d", owner: nil, following: following)
                }
            ),
        ]
        for following: Int64 in [0, 3] {
            for (name, end) in ends {
                let refused = await #expect(throws: HopError.self, "\(name) following \(following)") {
                    try await end(runs[0], following)
                }
                #expect(refused?.code == .refused)
                #expect(
                    refused?.reason.contains("ends at entry 1, not at entry \(following)") == true,
                    "\(refused.map { "\($0)" } ?? "")")
            }
        }
        #expect(try await store.history(runID: runs[0]).map(\.seq) == [1])
        #expect(try await store.run(id: runs[0])?.status == .running)

        // Following the last entry: written.
        #expect(try await ends[0].1(runs[0], 1).seq == 2)
        #expect(try await ends[1].1(runs[0], 2).seq == 3)
        #expect(try await store.run(id: runs[0])?.status == .failed)
        #expect(try await ends[2].1(runs[1], 1).seq == 2)
        #expect(try await store.run(id: runs[1])?.status == .diverged)
    }

    /// On PostgreSQL, a fenced write that waited for its run's row, which another client held
    /// while it appended an entry, is refused once the row is let go: it reads the history as
    /// that client left it. Before, the statement that locked the row read where the history
    /// ended as of before its wait (READ COMMITTED), and the write went on after the other
    /// client's entry as if the history ended where the writer last saw it.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aFencedWriteThatWaitedForItsRunsRowSeesTheEntryItsHolderAppended() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await TestBackend.postgres.open(folder)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.record(
            .hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil), runID: run.id, following: 0)

        let holder = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: PostgresNIO asserts that each connection is closed.
        defer { Task { try? await holder.close() } }
        let quiet = PostgresConnectionLossTests.quiet
        _ = try await holder.query("BEGIN", logger: quiet).collect()
        _ = try await holder.query("SELECT id FROM runs WHERE id = \(run.id) FOR UPDATE", logger: quiet).collect()
        _ = try await holder.query(
            "INSERT INTO history (run_id, seq, kind, step, value, at) VALUES (\(run.id), 2, 'decision', 'outside', '1', 0)",
            logger: quiet
        ).collect()
        let write = Task {
            try await store.record(.decision(name: "inside", value: "1"), runID: run.id, following: 1)
        }
        try await PostgresRowLockTests.waitUntilAStatementWaitsForALock("the write waits for the run's row", in: folder)
        _ = try await holder.query("COMMIT", logger: quiet).collect()
        try await holder.close()

        let refused = await #expect(throws: HopError.self) { try await write.value }
        #expect(refused?.code == .refused)
        #expect(
            refused?.reason.contains("ends at entry 2, not at entry 1") == true, "\(refused.map { "\($0)" } ?? "")")
        #expect(try await store.history(runID: run.id).map(\.step) == ["splash", "outside"])
    }

    /// An engine whose step failed its last attempt does not fail the run on a history the
    /// database no longer holds: here another writer appended an entry while the step ran (to
    /// the engine, the same as a failover that lost its last commits). It executes the run again
    /// from the database's history, where the step is in flight, and the step runs again.
    @Test(arguments: TestBackend.all)
    func aStepsLastFailureOnAHistoryThatMovedIsJudgedAgainOnTheDatabases(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let engine = try await startupEngine(folder, backend: backend, logger: logs.logger(label: "test"))
        let attempts = Mutex(0)
        engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 1)) { step in
            let attempt = attempts.withLock {
                $0 += 1
                return $0
            }
            if attempt == 1 {
                try await engine.storage.record(.decision(name: "outside", value: "1"), runID: step.runID, owner: nil)
            }
            throw CacheError()
        }
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .failed)
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .decision, .fail], "\(history)")
        Self.expectJudgedAgain(history, times: attempts.withLock { $0 }, logs: logs)
    }

    /// The same for a flow body that throws after its step returned: the step's end, held for
    /// the run's next record, is refused too, so the step runs again (its end was never written)
    /// and the body throws again on the history the database holds.
    @Test(arguments: TestBackend.all)
    func aFlowBodysErrorOnAHistoryThatMovedIsJudgedAgainOnTheDatabases(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let logs = InMemoryLogHandler.keepingEverything()
        let executions = Mutex(0)
        let flow = Flow("startup", version: "1") { flow in
            try await flow.hop(to: "splash")
            let execution = executions.withLock {
                $0 += 1
                return $0
            }
            if execution == 1 {
                try await store.record(.decision(name: "outside", value: "1"), runID: flow.runID, owner: nil)
            }
            throw CacheError()
        }
        let engine = try await startupEngine(
            folder, logger: logs.logger(label: "test"), flow: flow, storage: store)
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .failed)
        let history = try await store.history(runID: run.id)
        // The step's end was written after the outside entry by the second execution, or
        // before it (its write coming first) and the body's error then refused.
        #expect(
            [[.hop, .decision, .unhop, .fail], [.hop, .unhop, .decision, .fail]].contains(history.map(\.kind)),
            "\(history)")
        Self.expectJudgedAgain(history, times: executions.withLock { $0 }, logs: logs)
    }

    /// The same for a divergence: an engine whose replay finds the code asking for another
    /// path than the history it read does not mark the run diverged once the database's history
    /// has moved on (here another writer appended an entry while the body replayed). It replays
    /// the history the database holds, with which this code agrees, and the run completes.
    @Test(arguments: TestBackend.all)
    func aDivergenceOnAHistoryThatMovedIsJudgedAgainOnTheDatabases(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.record(
            .hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil), runID: run.id, following: 0)
        try await store.record(
            [.unhop(token: try #require(hop.token), output: nil), .decision(name: "first", value: "true")],
            runID: run.id, owner: nil, following: 1, durability: .now)

        let logs = InMemoryLogHandler.keepingEverything()
        let executions = Mutex(0)
        let flow = Flow("startup", version: "1") { flow in
            try await flow.hop(to: "splash")
            let execution = executions.withLock {
                $0 += 1
                return $0
            }
            if execution == 1 {
                // Entry 4, appended while the body replays; then the body asks for another
                // decision than entry 3's, which diverges from the history it read.
                try await store.record(.decision(name: "outside", value: "true"), runID: flow.runID, owner: nil)
                _ = try await flow.decide("second") { true }
            }
            _ = try await flow.decide("first") { true }
            _ = try await flow.decide("outside") { false }
            try await flow.hop(to: "main")
        }
        let engine = try await startupEngine(folder, logger: logs.logger(label: "test"), flow: flow, storage: store)
        #expect(try await engine.resumeAll() == 1)
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        let history = try await store.history(runID: run.id)
        #expect(
            history.map { "\($0.kind.rawValue) \($0.step ?? "")" } == [
                "hop splash", "unhop splash", "decision first", "decision outside", "hop main", "unhop main",
                "complete ",
            ], "\(history)")
        #expect(executions.withLock { $0 } == 2)
        #expect(!logs.texts(atLeast: .error).contains { $0.contains("diverged") }, "\(logs.texts(atLeast: .error))")
        #expect(
            logs.texts(atLeast: .warning).count { $0.contains("does not end at the entry this engine recorded last") }
                == 1, "\(logs.texts(atLeast: .warning))")
    }

    /// The run's failure was recorded by the second try (`times`), after the outside entry,
    /// with one warning that the history had moved.
    private static func expectJudgedAgain(_ history: [HistoryEntry], times: Int, logs: InMemoryLogHandler) {
        #expect(times == 2, "\(history)")
        #expect(history.dropLast().contains { $0.step == "outside" }, "\(history)")
        #expect(
            logs.texts(atLeast: .warning).count { $0.contains("does not end at the entry this engine recorded last") }
                == 1, "\(logs.texts(atLeast: .warning))")
    }
}
