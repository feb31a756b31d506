import Foundation
import HopEngine
import HopStore
import HopStoreTestSupport
import HopTestSupport
import InMemoryLogging
import Logging
import MetricsTestKit
import Synchronization
import Testing

/// `Configuration.lapsedLeases`: what an engine does with a run whose lease it could not renew
/// before the lease ended. The process tests cut an engine off from its PostgreSQL server for
/// real (`PostgresPartitionTests`); these hold its renewals and claims unanswered in process.
@Suite struct LapsedLeaseTests {
    /// What the splash and the observer of a test's engine noted.
    final class Notes: Sendable {
        let list = Mutex<[String]>([])
        let ready = Mutex(false)
        let metrics = TestMetrics()
        /// The runs this engine counted lost because their leases lapsed, when the splash was
        /// first entered.
        let lapsedAtEntry = Mutex<Int64?>(nil)

        /// The runs this engine counted lost because their leases lapsed.
        func lapses() throws -> Int64 {
            try metrics.expectCounter("hop_runs_lost_total", [("reason", "lease_lapsed")]).totalValue
        }
    }

    /// The lease of the tests' engines.
    static let lease = Duration.seconds(2)

    /// The engine, its splash noting each entry ("entered") and each cancellation
    /// ("cancelled"); the first entry lasts until cancelled, later ones return at once. With
    /// `cutOffAtEntry`, the first entry holds the engine's renewals and claims until that gate
    /// opens, first noting the lapses so far (``Notes/lapsedAtEntry``).
    private static func engine(
        _ storage: FaultyStorage, _ lapsedLeases: HopEngine.LapsedLeases, logs: InMemoryLogHandler, notes: Notes,
        cutOffAtEntry: Gate? = nil
    ) -> HopEngine {
        var configuration = HopEngine.Configuration(leaseDuration: Self.lease, lapsedLeases: lapsedLeases)
        configuration.metricsFactory = notes.metrics
        configuration.observer = { event in
            if case .ready = event { notes.ready.withLock { $0 = true } }
        }
        let engine = HopEngine(storage: storage, logger: logs.logger(label: "test"), configuration: configuration)
        engine.register(startupFlow())
        engine.register(step: "splash") { _ in
            // An execution stopped as it entered the step (its lease lapsed on a starved
            // machine just before) is not the test's: the run is claimed and entered again.
            if Task.isCancelled { throw CancellationError() }
            let first = notes.list.withLock { $0.isEmpty }
            if first, let cutOffAtEntry {
                notes.lapsedAtEntry.withLock { $0 = try? notes.lapses() }
                storage.holdLeases(until: cutOffAtEntry)
            }
            notes.list.withLock { $0.append("entered") }
            guard first else { return }
            do {
                try await Task.sleep(for: .seconds(600))
            } catch {
                notes.list.withLock { $0.append("cancelled") }
                throw error
            }
        }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        engine.register(step: "main") { _ in }
        return engine
    }

    /// A running engine on a new database of `backend` (with its storage, logs and notes) and
    /// the run it started, in its splash; `asked`: the moment before it started the run.
    private static func inSplash(
        _ backend: TestBackend, _ folder: TemporaryDirectory, _ lapsedLeases: HopEngine.LapsedLeases,
        cutOffAtEntry: Gate? = nil
    ) async throws -> (
        storage: FaultyStorage, logs: InMemoryLogHandler, notes: Notes, engine: HopEngine,
        service: Task<Void, any Error>, id: Int64, asked: ContinuousClock.Instant
    ) {
        let storage = FaultyStorage(try await backend.open(folder))
        let logs = InMemoryLogHandler.keepingEverything()
        let notes = Notes()
        let engine = Self.engine(storage, lapsedLeases, logs: logs, notes: notes, cutOffAtEntry: cutOffAtEntry)
        let service = Task { try await engine.run() }
        try await waitUntil("the engine runs") { notes.ready.withLock { $0 } }
        let asked = ContinuousClock.now
        let id = try await engine.start("startup").id
        // A test cuts the engine off once in the step: on a loaded machine the flow may take
        // longer than a lease to get there, and a lease lapsed before would stop the execution
        // before its step.
        try await waitUntil("the splash is entered", timeout: .seconds(60)) {
            notes.list.withLock { $0.contains("entered") }
        }
        return (storage, logs, notes, engine, service, id, asked)
    }

    /// With `.stopExecuting`, an engine whose renewals go unanswered stops its step once the
    /// lease it took lapses (less a tenth), writing nothing; once its database answers, it
    /// executes the run again from its history (the step runs again) and carries it on.
    @Test(arguments: TestBackend.all)
    func anEngineThatStopsOnALapsedLeaseStopsItsStepThenRunsItAgainOnceTheDatabaseAnswers(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        // Cut off as the step is entered, by the step: a loaded machine may starve the engine's
        // renewals past a lease (CI's did), and a lapse before the cut-off would stop the step
        // before the test could. One before the step stops the execution before it and claims
        // the run again; only the lapses from the step's entry on are this test's.
        let cutOff = Gate()
        let (storage, logs, notes, engine, service, id, asked) = try await Self.inSplash(
            backend, folder, .stopExecuting, cutOffAtEntry: cutOff)
        defer { service.cancel() }
        try await waitUntil("the splash is stopped", timeout: .seconds(60)) {
            notes.list.withLock { $0.contains("cancelled") }
        }
        let after = ContinuousClock.now - asked
        #expect(
            after >= Self.lease * 0.9,
            "stopped \(after) after its lease was taken, before it lapsed")
        #expect(notes.list.withLock { $0 } == ["entered", "cancelled"])
        let lapsedBefore = try #require(notes.lapsedAtEntry.withLock { $0 })
        let lapsed = try notes.lapses() - lapsedBefore
        #expect(
            lapsed == 1, "\(lapsed) lapses since the cut-off (\(lapsedBefore) before): \(logs.texts(atLeast: .warning))"
        )
        #expect(
            logs.texts(atLeast: .warning).contains { $0.contains("could not renew the leases of runs") },
            "\(logs.texts(atLeast: .warning))")
        // Nothing written: the run is as it was when its step was entered, held by this engine.
        #expect(try await path(of: id, in: storage.base) == ["hop splash"])
        #expect(try await storage.base.run(id: id)?.owner == engine.incarnation.id)

        cutOff.open()
        try await waitUntil("the run parks at onboarding", timeout: .seconds(60)) {
            let run = try await storage.base.run(id: id)
            return run?.status == .parked && run?.currentStep == "onboarding"
        }
        #expect(notes.list.withLock { $0 } == ["entered", "cancelled", "entered"])
        let history = try await storage.base.history(runID: id)
        #expect(
            try await path(of: id, in: storage.base) == [
                "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding",
            ], "\(history)")
        #expect(!history.contains { [HistoryKind.takeover, .error, .fail, .diverge].contains($0.kind) }, "\(history)")
    }

    /// With the default, `.keepExecuting`, the same engine's step runs on while the database
    /// does not answer, and its end is recorded once the database answers: a step runs once
    /// across an outage, however long.
    @Test(arguments: TestBackend.all)
    func anEngineThatKeepsExecutingOnALapsedLeaseLetsItsStepRunOn(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let (storage, logs, notes, engine, service, id, _) = try await Self.inSplash(backend, folder, .keepExecuting)
        defer { service.cancel() }
        let cutOff = Gate()
        storage.holdLeases(until: cutOff)
        // The lease in the database expires (a stopping engine stops its step before then).
        try await waitUntil("the run's lease expired", timeout: .seconds(60)) {
            let lease = try await storage.base.run(id: id)?.leaseExpiresAt
            return lease.map { $0 < storage.base.now() } ?? false
        }
        #expect(notes.list.withLock { $0 } == ["entered"])
        #expect(!logs.texts(atLeast: .warning).contains { $0.contains("could not renew the leases of runs") })
        cutOff.open()
        #expect(try await engine.cancel(flow: "startup", run: id).status == .cancelled)
        try await waitUntil("the splash is cancelled by the run's end") {
            notes.list.withLock { $0.contains("cancelled") }
        }
        #expect(notes.list.withLock { $0 } == ["entered", "cancelled"])
    }

    /// With the default, a second engine on the database takes the run over once its lease
    /// expired (the first one's renewals go unanswered, its claims fail, its process lives). The first one, its
    /// step still running, learns it from its watch: it stops the step, writes nothing more,
    /// and counts the run in `hop_runs_lost_total{reason="taken_over"}`.
    @Test(arguments: TestBackend.all)
    func anEngineWhoseRunWasTakenOverStopsItsStepAndCountsIt(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let (storage, logs, notes, _, service, id, _) = try await Self.inSplash(backend, folder, .keepExecuting)
        defer { service.cancel() }
        // Its renewals unanswered; its claims fail (its own look would otherwise claim the run
        // back as its lease expires, before the other engine can).
        let cutOff = Gate()
        defer { cutOff.open() }
        storage.holdLeases(until: cutOff, claimsPass: true)
        storage.fail("claim(runIDs:owner:until:)", times: 1_000_000, as: .busy)
        storage.fail("claim(runID:owner:until:)", times: 1_000_000, as: .busy)

        let otherNotes = Notes()
        let other = Self.engine(
            FaultyStorage(try await backend.open(folder)), .keepExecuting, logs: logs, notes: otherNotes)
        let otherService = Task { try await other.run() }
        defer { otherService.cancel() }
        try await waitUntil("the other engine enters the splash", timeout: .seconds(60)) {
            otherNotes.list.withLock { $0.contains("entered") }
        }
        try await waitUntil("the first engine stops its splash", timeout: .seconds(60)) {
            notes.list.withLock { $0.contains("cancelled") }
        }
        #expect(try notes.metrics.expectCounter("hop_runs_lost_total", [("reason", "taken_over")]).totalValue == 1)
        #expect(
            (try? notes.metrics.expectCounter("hop_runs_lost_total", [("reason", "lease_lapsed")]).totalValue) ?? 0 == 0
        )
        let history = try await storage.base.history(runID: id)
        #expect(history.map(\.kind) == [.hop, .takeover], "\(history)")
    }
}
