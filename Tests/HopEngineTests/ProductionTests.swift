import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging
import MetricsTestKit
import Synchronization
import Testing

@Suite struct ProductionTests {
    static let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    @Test func aStepThatOverrunsItsTimeoutIsCancelledAndTheFlowTakesItsTimeoutBranch() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let engine = HopEngine(store: store, logger: Self.quiet)
        let cancelled = Mutex(false)
        engine.register(
            Flow("startup", version: "1") { flow in
                if try await flow.hop(to: "splash", timeout: .milliseconds(100)).timedOut {
                    try await flow.hop(to: "offline")
                }
            })
        engine.register(step: "splash") { _ in
            do { try await Task.sleep(for: .seconds(600)) } catch {
                cancelled.withLock { $0 = true }
                throw error
            }
        }
        engine.register(step: "offline") { _ in }
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(cancelled.withLock { $0 })
        #expect(
            try await path(of: run.id, in: store) == ["hop splash", "timeout splash", "hop offline", "unhop offline"])
    }

    @Test func aParkedStepTimesOutAtItsStoredDeadlineEvenAfterAnEngineRestart() async throws {
        let folder = try TemporaryDirectory()
        let flow = Flow("startup", version: "1") { flow in
            if try await flow.hop(to: "onboarding", timeout: .milliseconds(300)).timedOut {
                try await flow.hop(to: "main")
            }
        }
        let first = try await startupEngine(folder, flow: flow)
        let run = try await first.start("startup")
        #expect(try await first.settled(runID: run.id)?.status == .parked)
        let parked = try #require(try await first.storage.run(id: run.id))
        let wakeAt = try #require(parked.wakeAt)

        // A new engine (the daemon restarted) times the step out at the stored deadline.
        let second = try await startupEngine(folder, flow: flow)
        let service = Task { try await second.run() }
        defer { service.cancel() }
        // A deadline against a hang, not a measure: the timeout's own time is checked below. 10 s
        // ran out in 3 full suites of 11 (one a CI run), each time while WhereCodeRunsTests held
        // one of this process's two cooperative threads blocked on purpose.
        try await waitUntil("the run completes", timeout: .seconds(30)) {
            try await second.storage.run(id: run.id)?.status == .completed
        }
        let history = try await second.storage.history(runID: run.id)
        let timeout = try #require(history.first { $0.kind == .timeout })
        #expect(timeout.at >= wakeAt.addingTimeInterval(-0.01))
        #expect(
            try await path(of: run.id, in: second.storage) == [
                "hop onboarding", "timeout onboarding", "hop main", "unhop main",
            ])
    }

    @Test func aThousandSubjectsRunAtOnceAndTheirWritesShareTransactions() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let engine = HopEngine(store: store, logger: Self.quiet)
        engine.register(
            Flow("pair", version: "1") { flow in
                try await flow.hop(to: "first")
                try await flow.hop(to: "second")
            })
        engine.register(step: "first") { _ in }
        engine.register(step: "second") { _ in }
        let before = await store.commitStatistics
        let runs = try await withThrowingTaskGroup(of: RunRecord.self) { group in
            for subject in 0..<1000 { group.addTask { try await engine.start("pair", subject: "device-\(subject)") } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        for run in runs { #expect(try await engine.settled(runID: run.id)?.status == .completed) }
        let after = await store.commitStatistics
        let writes = after.writes - before.writes
        let transactions = after.transactions - before.transactions
        // A step that returns is unhopped with the run's next record, in one write.
        #expect(writes >= 1000 * 4, "each run's start, first hop, unhop with the second hop, unhop with the completion")
        #expect(transactions < writes / 2, "\(writes) writes took \(transactions) transactions")
        #expect(try await store.integrityCheck() == ["ok"])
    }

    @Test func parkedRunsHoldNoTaskAndWakeFromHistoryWhenUnhoppedByAnotherConnection() async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder)
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        var runs: [RunRecord] = []
        for subject in 0..<200 { runs.append(try await engine.start("startup", subject: "user-\(subject)")) }
        for run in runs { #expect(try await engine.settled(runID: run.id)?.status == .parked) }
        #expect(await engine.executingCount == 0)

        let operator_ = try await HopStore.open(path: folder.database)
        for subject in 0..<200 {
            _ = try await operator_.unhopParked(flow: "startup", subject: "user-\(subject)", step: "onboarding")
        }
        try await waitUntil("every run parks at login") {
            try await operator_.runs(flow: "startup").allSatisfy { $0.currentStep == "login" && $0.status == .parked }
        }
        // Parked again, each run lets its task go (just after its park is committed).
        try await waitUntil("no run holds a task") { await engine.executingCount == 0 }
    }

    @Test func metricsCountHopsUnhopsResumesAndTimeSteps() async throws {
        let folder = try TemporaryDirectory()
        let metrics = TestMetrics()
        let store = try await HopStore.open(path: folder.database)
        let engine = HopEngine(store: store, logger: Self.quiet, configuration: .init(metricsFactory: metrics))
        engine.register(startupFlow())
        engine.register(step: "splash") { _ in }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        engine.register(step: "main") { _ in }
        let run = try await engine.start("startup")
        _ = try await engine.settled(runID: run.id)
        let onboarding = try #require(try await engine.inFlight(flow: "startup"))
        try await engine.unhop(flow: "startup", token: onboarding.token)
        _ = try await engine.settled(runID: run.id)
        try await engine.storeSession(subject: "default", userID: "alice", token: "t")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)

        #expect(try metrics.expectCounter("hop_hops_total").totalValue == 4)
        #expect(
            try metrics.expectCounter("hop_unhops_total").totalValue == 3,
            "splash and main in process, onboarding by the API")
        #expect(try metrics.expectCounter("hop_resumes_total").totalValue == 2)
        #expect(try metrics.expectTimer("hop_step_duration_seconds", [("step", "splash")]).values.count == 1)
    }
}
