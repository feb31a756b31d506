import Foundation
import HopEngine
import HopStore
import HopStoreTestSupport
import HopTestSupport
import InMemoryLogging
import Logging
import MetricsTestKit
import ServiceLifecycleTestKit
import Synchronization
import Testing

/// The engine's paths that only a failing database takes (an I/O error, a lost connection):
/// whatever fails, no run stays held by an engine that is not executing it.
@Suite struct DatabaseFailureTests {
    /// A resume claims a batch of runs, then reads their histories. When the database fails
    /// that read, the batch goes back at once, and the next look (this engine's or another's)
    /// resumes it. Before, the runs stayed held by this live engine, which was not executing
    /// them, until their leases expired (a minute here): no engine resumed them meanwhile.
    @Test(arguments: TestBackend.all)
    func aResumeWhoseHistoryReadFailsLetsItsRunsGoAtOnce(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.open(folder)
        // Runs in flight as an engine that stopped left them: running, held by none.
        var ids: [Int64] = []
        for subject in ["a", "b", "c"] {
            ids.append(try await Self.runInFlight(in: database, subject: subject))
        }
        let storage = FaultyStorage(database)
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))

        storage.fail("histories(runIDs:)")
        await #expect(throws: HopError.self) { try await engine.resumeAll() }
        #expect(storage.pendingFaults("histories(runIDs:)") == 0, "the resume did not read the histories")
        for id in ids {
            let run = try #require(try await database.run(id: id))
            #expect(run.owner == nil, "run \(id) stays held by \(run.owner ?? "?"), which does not execute it")
        }

        #expect(try await engine.resumeAll() == ids.count)
        for id in ids {
            #expect(try await engine.settled(runID: id)?.status == .parked, "run \(id) did not reach onboarding")
        }
    }

    /// A restart the database refuses changes nothing: the old run's step in flight goes on.
    /// Before, the engine cancelled that step before it asked the database, so the step was
    /// cancelled, its run let go, and the step entered again by the next look.
    @Test(arguments: TestBackend.all)
    func aRestartTheDatabaseRefusesLeavesTheStepInFlightRunning(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = FaultyStorage(try await backend.open(folder))
        let engine = try await startupEngine(folder, storage: storage)
        let gate = Gate()
        let entered = Atomic(0)
        let cancelled = Atomic(false)
        engine.register(step: "splash") { _ in
            entered.add(1, ordering: .relaxed)
            await gate.wait()
            if Task.isCancelled { cancelled.store(true, ordering: .relaxed) }
        }
        let run = try await engine.start("startup")
        try await HopStoreTestSupport.waitUntil("splash is entered", timeout: .seconds(30)) {
            entered.load(ordering: .relaxed) == 1
        }

        storage.fail("restartRun(flow:subject:runID:version:)")
        await #expect(throws: HopError.self) { try await engine.restart(flow: "startup") }
        #expect(storage.pendingFaults("restartRun(flow:subject:runID:version:)") == 0, "the restart did not write")
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.currentStep == "onboarding", "\(storage.trace)")
        let (times, wasCancelled) = (entered.load(ordering: .relaxed), cancelled.load(ordering: .relaxed))
        #expect(times == 1 && !wasCancelled, "splash entered \(times) times, cancelled: \(wasCancelled)")
    }

    /// Written, a restart cancels the old run's step in flight and starts the new run.
    @Test func aRestartCancelsTheOldRunsStepInFlight() async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder)
        let gate = Gate()
        let calls = Atomic(0)
        let cancelled = Atomic(false)
        engine.register(step: "splash") { _ in
            guard calls.add(1, ordering: .relaxed).newValue == 1 else { return }  // the new run's splash
            await gate.wait()
            if Task.isCancelled { cancelled.store(true, ordering: .relaxed) }
        }
        let old = try await engine.start("startup")
        try await HopStoreTestSupport.waitUntil("splash is entered", timeout: .seconds(30)) {
            calls.load(ordering: .relaxed) == 1
        }
        let new = try await engine.restart(flow: "startup")
        #expect(new.id > old.id)
        gate.open()
        try await HopStoreTestSupport.waitUntil("the old run's step sees it was cancelled", timeout: .seconds(30)) {
            cancelled.load(ordering: .relaxed)
        }
        #expect(try await engine.settled(runID: new.id)?.currentStep == "onboarding")
        #expect(try await engine.storage.run(id: old.id)?.status == .cancelled)

        // Named, a retried restart or cancel changes nothing.
        await #expect(throws: HopError.self) { try await engine.restart(flow: "startup", run: old.id) }
        #expect(try await engine.cancel(flow: "startup", run: new.id).status == .cancelled)
        await #expect(throws: HopError.self) { try await engine.cancel(flow: "startup", run: new.id) }
        #expect(try await engine.storage.run(id: new.id)?.status == .cancelled)
        #expect(try await engine.storage.latestRun(flow: "startup", subject: "default")?.id == new.id)
    }

    /// The same for one run, claimed by its own execution (a start that finds the subject's run
    /// unfinished): the execution stops, and its run goes back at once.
    @Test(arguments: TestBackend.all)
    func anExecutionWhoseHistoryReadFailsLetsItsRunGoAtOnce(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.open(folder)
        let id = try await Self.runInFlight(in: database)
        let storage = FaultyStorage(database)
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))

        storage.fail("history(runID:limit:)")
        #expect(try await engine.start("startup").id == id)
        let stopped = try await engine.settled(runID: id)
        #expect(storage.pendingFaults("history(runID:limit:)") == 0, "the execution did not read the history")
        #expect(stopped?.status == .running)
        #expect(stopped?.owner == nil, "the run stays held by \(stopped?.owner ?? "?"), which does not execute it")

        #expect(try await engine.resumeAll() == 1)
        #expect(try await engine.settled(runID: id)?.status == .parked, "the run did not reach onboarding")
    }

    /// A step returned, and its flow body then awaits something else (a slow decision's read),
    /// so the step's unhop is written alone, a few milliseconds later; the database fails that
    /// write. The execution stops there, and the run goes on from its durable history (the step
    /// runs again: its end was not written). Before, the execution went on without the unhop:
    /// it recorded the decision while the step was still in flight, and its next hop was
    /// refused ("step 'splash' is still in flight"), which failed the run for good.
    @Test(arguments: TestBackend.all)
    func aStepsUnhopWrittenAloneThatFailsStopsTheExecutionAndTheRunGoesOn(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = FaultyStorage(try await backend.open(folder))
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))
        let splashes = Mutex(0)
        engine.register(
            Flow("slow", version: "1") { flow in
                try await flow.hop(to: "splash")
                _ = try await flow.decide("slow read") {
                    // Slow until the unhop was written alone (and failed). A fixed 200 ms was once
                    // not enough in CI's first minute: the unhop, still held, went with this
                    // decision's record, that record failed, and the unhop was written after it:
                    // the splash did not run again.
                    try await HopStoreTestSupport.waitUntil("the unhop was written alone", timeout: .seconds(30)) {
                        storage.injectedFaults == 1
                    }
                    return true
                }
                try await flow.hop(to: "main")
            })
        engine.register(step: "splash") { _ in splashes.withLock { $0 += 1 } }

        // The run's creation, the wait for it to be durable, the hop to splash; then the unhop alone.
        storage.failCall(number: 4)
        let id = try await engine.start("slow").id
        let stopped = try await engine.settled(runID: id)
        #expect(storage.injectedFaults == 1, "calls: \(storage.trace)")
        #expect(stopped?.status == .running, "\(String(describing: stopped))")
        #expect(stopped?.owner == nil)

        #expect(try await engine.resumeAll() == 1)
        #expect(try await engine.settled(runID: id)?.status == .completed)
        let history = try await storage.base.history(runID: id, limit: nil)
        #expect(
            try await path(of: id, in: storage.base) == [
                "hop splash", "unhop splash", "decision slow read", "hop main", "unhop main",
            ], "\(history)")
        #expect(!history.contains { [.error, .fail, .diverge].contains($0.kind) }, "\(history)")
        #expect(splashes.withLock { $0 } == 2, "the step whose end was not written runs again; calls: \(storage.trace)")
        #expect(
            storage.trace.contains("record(_:runID:owner:following:durability:) (failed)"), "calls: \(storage.trace)")
    }

    /// A running engine whose execution of a run stopped because the database failed, or which
    /// could not read a run its own change woke (a stored session), resumes the run at its
    /// watch's next poll. Before, the run waited for the watch's look for runs to resume every
    /// third of a lease (200 s here; 3.3 s by default), and `storeSession` threw though the
    /// session was stored.
    @Test(arguments: TestBackend.all)
    func aRunLeftByADatabaseFailureIsResumedAtTheWatchsNextPoll(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = FaultyStorage(try await backend.open(folder))
        let logs = InMemoryLogHandler.keepingEverything()
        let engine = try await startupEngine(
            folder, logger: logs.logger(label: "test"), storage: storage,
            configuration: .init(leaseDuration: .seconds(600)))
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        // A deadline far below the look every third of a lease, far above what a loaded machine takes.
        func waitFor(_ what: String, _ condition: @escaping (RunRecord) -> Bool) async throws {
            do {
                try await HopStoreTestSupport.waitUntil("the run is \(what)", timeout: .seconds(60)) {
                    guard let run = try await storage.base.run(id: 1) else { return false }
                    #expect(run.status.isUnfinished || run.status == .completed, "\(run)")
                    return condition(run)
                }
            } catch {
                let log = logs.texts(atLeast: .debug).joined(separator: "\n")
                Issue.record("\(error)\ncalls: \(storage.trace)\nlog:\n\(log)")
                throw error
            }
        }

        storage.fail("record(_:runID:owner:following:durability:)")  // the run's first hop
        #expect(try await engine.start("startup").id == 1)
        try await waitFor("parked at onboarding") { $0.status == .parked && $0.currentStep == "onboarding" }
        #expect(storage.pendingFaults("record(_:runID:owner:following:durability:)") == 0)

        try await engine.unhop(flow: "startup", step: "onboarding")
        try await waitFor("parked at login") { $0.status == .parked && $0.currentStep == "login" }
        storage.fail("run(id:)")  // the read of the run the session wakes
        try await engine.storeSession(subject: "default", userID: "alice", token: "t")
        #expect(storage.pendingFaults("run(id:)") == 0)
        try await waitFor("completed") { $0.status == .completed }
    }

    /// An engine whose database fails as it starts (its first look for runs to resume) tries
    /// again, and resumes its runs once the database answers. Before, `run()` threw, which ends
    /// a daemon's whole service group, for a lock or a connection lost for a moment.
    @Test(arguments: TestBackend.all)
    func anEngineWhoseDatabaseFailsAsItStartsTriesAgainAndResumesItsRuns(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.open(folder)
        let id = try await Self.runInFlight(in: database)
        let storage = FaultyStorage(database)
        let logs = InMemoryLogHandler.keepingEverything()
        let ready = Atomic<Bool>(false)
        let engine = try await startupEngine(
            folder, logger: logs.logger(label: "test"), storage: storage,
            configuration: .init(
                leaseDuration: .seconds(60),
                observer: { if case .ready = $0 { ready.store(true, ordering: .sequentiallyConsistent) } }))
        storage.fail("claimableRuns(versions:now:limit:)", times: 2)
        storage.fail("expireSessions(now:)", as: .busy)
        let service = Task { try await engine.run() }
        defer { service.cancel() }

        try await HopStoreTestSupport.waitUntil("the run is parked at onboarding", timeout: .seconds(60)) {
            try await database.run(id: id).map { $0.status == .parked && $0.currentStep == "onboarding" } ?? false
        }
        // Ready once the start-up succeeded, which may come just after the run it resumed parked.
        try await HopStoreTestSupport.waitUntil("the engine reports ready", timeout: .seconds(30)) {
            ready.load(ordering: .sequentiallyConsistent)
        }
        #expect(storage.injectedFaults == 3, "calls: \(storage.trace)")
        #expect(logs.texts(atLeast: .error).filter { $0.contains("cannot start") }.count == 3)
    }

    /// A failure at start-up that no retry cures (here a schema this binary does not have) is
    /// thrown out of `run()`, with no run left held and nothing reported ready.
    @Test func aStartUpFailureThatNeedsAnOperatorIsThrown() async throws {
        let folder = try TemporaryDirectory()
        let database = try await TestBackend.sqlite.open(folder)
        let id = try await Self.runInFlight(in: database)
        let storage = FaultyStorage(database)
        let engine = try await startupEngine(folder, storage: storage)
        storage.fail("claimableRuns(versions:now:limit:)", as: .schemaTooNew)
        await #expect(throws: HopError.self) {
            do { try await engine.run() } catch let error as HopError {
                #expect(error.code == .schemaTooNew)
                throw error
            }
        }
        #expect(try await database.run(id: id)?.owner == nil)
    }

    /// A start-up that throws after it began executing a run (here: a session that expired
    /// while no daemon ran re-routes a run into a long step, then the look for runs to resume
    /// fails in a way no retry cures) stops that execution and releases the run before `run()`
    /// returns: nothing goes on executing behind a daemon that is exiting.
    @Test func aStartUpThatThrowsStopsWhatItBegan() async throws {
        let folder = try TemporaryDirectory()
        let database = try await TestBackend.sqlite.open(folder)
        func register(on engine: HopEngine) {
            engine.register(
                Flow("f", version: "1") { flow in
                    try await flow.hop(to: "main")
                    try await flow.hop(to: "work")
                })
            engine.register(step: "main", .external(unhopWhen: .sessionRemoved))
            engine.register(step: "work") { _ in try await Task.sleep(for: .seconds(600)) }
        }
        let first = HopEngine(
            storage: database, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        register(on: first)
        // Parked on "main", which lasts while the session is stored; then the login is stored
        // again, expiring soon. (Stored expiring soon from the start, a loaded machine could let
        // it expire before the run parked: the run went on into its 10-minute step.)
        try await database.storeSession(
            subject: "s", userID: "alice", token: "t", expiresAt: Date().addingTimeInterval(3600))
        let run = try await first.start("f", subject: "s")
        let parked = try #require(try await first.settled(runID: run.id))
        try #require(parked.status == .parked && parked.currentStep == "main", "\(parked)")
        let expiry = Date().addingTimeInterval(1)
        try await database.storeSession(subject: "s", userID: "alice", token: "t", expiresAt: expiry)
        try await HopStoreTestSupport.waitUntil("the session's expiry has come") {
            Date() > expiry
        }

        let storage = FaultyStorage(database)
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        register(on: engine)
        storage.fail("claimableRuns(versions:now:limit:)", as: .schemaTooNew)
        await #expect(throws: HopError.self) { try await engine.run() }
        #expect(storage.trace.contains("expireSessions(now:)"), "calls: \(storage.trace)")
        #expect(await engine.executingCount == 0, "the re-routed run still executes")
        let left = try #require(try await database.run(id: run.id))
        #expect(left.status == .running && left.owner == nil, "\(left)")
    }

    /// An engine shut down gracefully while its start-up waits to try again stops at once, and
    /// without an error: the service group's shutdown is not a failure.
    @Test func anEngineShutDownWhileItsStartUpTriesAgainStopsWithoutAnError() async throws {
        let folder = try TemporaryDirectory()
        let storage = FaultyStorage(try await TestBackend.sqlite.open(folder))
        let logs = InMemoryLogHandler.keepingEverything()
        let engine = try await startupEngine(folder, logger: logs.logger(label: "test"), storage: storage)
        storage.fail("claimableRuns(versions:now:limit:)", times: .max / 2)
        try await testGracefulShutdown { trigger in
            let stopped = Atomic<Bool>(false)
            let service = Task {
                defer { stopped.store(true, ordering: .sequentiallyConsistent) }
                try await engine.run()
            }
            defer { service.cancel() }
            try await HopStoreTestSupport.waitUntil("the start-up failed twice", timeout: .seconds(60)) {
                logs.texts(atLeast: .error).filter { $0.contains("cannot start") }.count >= 2
            }
            trigger.triggerGracefulShutdown()
            try await HopStoreTestSupport.waitUntil("the engine stops", timeout: .seconds(30)) {
                stopped.load(ordering: .sequentiallyConsistent)
            }
            try await service.value
        }
        #expect(logs.texts().contains { $0.contains("engine stopped before it was running") })
    }

    /// The start-up flow's engine on a SQLite storage that fails the calls a test names, with
    /// its logs kept, running and reported ready (`configuration`'s observer is told too).
    /// Cancel the service when done.
    static func readyEngine(
        _ folder: TemporaryDirectory, configuration: HopEngine.Configuration = .init()
    ) async throws -> (storage: FaultyStorage, logs: InMemoryLogHandler, service: Task<Void, any Error>) {
        let storage = FaultyStorage(try await TestBackend.sqlite.open(folder))
        let logs = InMemoryLogHandler.keepingEverything()
        let ready = Atomic<Bool>(false)
        var configuration = configuration
        let observer = configuration.observer
        configuration.observer = { event in
            if case .ready = event { ready.store(true, ordering: .sequentiallyConsistent) }
            observer?(event)
        }
        let engine = try await startupEngine(
            folder, logger: logs.logger(label: "test"), storage: storage, configuration: configuration)
        let service = Task { try await engine.run() }
        do {
            try await HopStoreTestSupport.waitUntil("the engine reports ready", timeout: .seconds(30)) {
                ready.load(ordering: .sequentiallyConsistent)
            }
        } catch {
            service.cancel()
            throw error
        }
        return (storage, logs, service)
    }

    /// A database that fails at every poll of the watch for a while (250 polls here, 12.5 s or
    /// more) is said once, then again every 10 s while it lasts, and once more when it answers
    /// again, with how many polls failed. Before, the watch logged each failed poll: 20 lines a
    /// second for as long as an outage lasts.
    @Test func aDatabaseThatFailsAtEveryPollIsSaidOnceAndWhenItAnswersAgain() async throws {
        let folder = try TemporaryDirectory()
        let (storage, logs, service) = try await Self.readyEngine(folder)
        defer { service.cancel() }

        let outageBegan = ContinuousClock.now
        storage.fail("changeVersion()", times: 250)
        // A long deadline against a hang: under the whole suite on 2 cores the 250 polls took up
        // to 80 s, and once over 120 s. The lines are counted against the outage as it lasted.
        try await HopStoreTestSupport.waitUntil("the engine says the database answers again", timeout: .seconds(300)) {
            logs.texts().contains { $0.contains("the database answers again") }
        }
        let outage = ContinuousClock.now - outageBegan
        #expect(storage.pendingFaults("changeVersion()") == 0)
        let errors = logs.texts(atLeast: .error)
        #expect(errors.first?.contains("trying again at each poll") == true, "\(errors)")
        #expect(errors.dropFirst().allSatisfy { $0.contains("the database still fails") }, "\(errors)")
        // One line at first, then one per 10 s of the outage (at least one: it lasted 12.5 s or more).
        let most = 1 + Int(outage / .seconds(10))
        #expect(errors.count >= 2 && errors.count <= most, "\(errors.count) lines in \(outage): \(errors)")
        // 249 when the watch's first read of the change counter (before its first poll, its
        // failure ignored) came after the faults were set: `.ready` is reported just before.
        let answered = logs.texts().filter { $0.contains("answers again") }
        #expect(
            answered.count == 1
                && ["250,", "250]", "249,", "249]"].contains { answered[0].contains("\"hop.failures\": " + $0) },
            "\(answered)")
    }

    /// An outage of the database is reported to the observer and in the metrics, once as it
    /// begins and once as it ends, whatever the number of polls it fails: an embedder's health
    /// check or status line can say the daemon waits for its database, and an operator's alert
    /// can fire on `hop_database_up == 0`. Before, only the log said so.
    @Test func aDatabaseThatFailsAtEveryPollIsReportedOnceToTheObserverAndTheMetrics() async throws {
        let folder = try TemporaryDirectory()
        let metrics = TestMetrics()
        let events = DatabaseEvents()
        let (storage, _, service) = try await Self.readyEngine(
            folder, configuration: .init(observer: events.observe, metricsFactory: metrics))
        defer { service.cancel() }
        #expect(try metrics.expectGauge("hop_database_up").lastValue == 1)

        // Ten failed polls: a poll every 50 ms, but with the whole suite on 2 cores 40 of them
        // took up to 49 s of the 60 s this wait allowed.
        storage.fail("changeVersion()", times: 10, as: .ioFailure)
        try await HopStoreTestSupport.waitUntil("the engine reports the database answers", timeout: .seconds(120)) {
            events.said.contains("answers")
        }
        #expect(storage.pendingFaults("changeVersion()") == 0)
        #expect(events.said == ["ready", "failing ioFailure", "answers"])
        #expect(try metrics.expectGauge("hop_database_up").values == [1, 0, 1])
    }

    /// What an engine reported of its database, and that it was ready, in order.
    final class DatabaseEvents: Sendable {
        private let events = Mutex<[String]>([])
        var said: [String] { events.withLock { $0 } }

        @Sendable func observe(_ event: EngineEvent) {
            switch event {
            case .databaseFailing(let error): events.withLock { $0.append("failing \(error.code)") }
            case .databaseAnswers: events.withLock { $0.append("answers") }
            case .ready: events.withLock { $0.append("ready") }
            default: break
            }
        }
    }

    /// A start-up that the database fails several times before it succeeds reports one outage,
    /// before ``EngineEvent/ready``; the gauge reads 0 until then.
    @Test func aStartUpTheDatabaseFailsReportsOneOutageBeforeReady() async throws {
        let folder = try TemporaryDirectory()
        let database = try await TestBackend.sqlite.open(folder)
        let storage = FaultyStorage(database)
        let metrics = TestMetrics()
        let events = DatabaseEvents()
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(observer: events.observe, metricsFactory: metrics))
        storage.fail("claimableRuns(versions:now:limit:)", times: 3, as: .busy)
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await HopStoreTestSupport.waitUntil("the engine reports ready", timeout: .seconds(60)) {
            events.said.contains("ready")
        }
        #expect(storage.injectedFaults == 3, "calls: \(storage.trace)")
        #expect(events.said == ["failing busy", "answers", "ready"])
        #expect(try metrics.expectGauge("hop_database_up").values == [0, 1])
    }

    /// Lease renewals that fail a dozen times in a row (a third of a 1 s lease apart: 4 s or
    /// more, longer on a loaded machine) are said once, then at most once per 10 s while they
    /// fail, and once more when a renewal succeeds again. Before, each failed renewal wrote its
    /// own line: every 3.3 s, with the default lease, for as long as it lasted.
    @Test func leaseRenewalsThatFailAreSaidOnceAndWhenTheySucceedAgain() async throws {
        let folder = try TemporaryDirectory()
        let (storage, logs, service) = try await Self.readyEngine(
            folder, configuration: .init(leaseDuration: HopEngine.Configuration.shortestLeaseDuration))
        defer { service.cancel() }

        let failures = 12
        let renewal = "renewLeases(owner:runIDs:until:)"
        let outageBegan = ContinuousClock.now
        storage.fail(renewal, times: failures)
        // Until the engine says so, or (without that line) a second renewal succeeded after them.
        try await HopStoreTestSupport.waitUntil("renewals succeed after the failures", timeout: .seconds(60)) {
            let renewals = storage.trace(of: renewal)
            let succeeded = renewals.reversed().prefix { $0 == renewal }.count
            return storage.pendingFaults(renewal) == 0
                && (succeeded >= 2 || (succeeded == 1 && logs.texts().contains { $0.contains("renewed again") }))
        }
        let outage = ContinuousClock.now - outageBegan
        let said = logs.texts(atLeast: .error).filter { $0.contains("lease") }
        #expect(said.first?.contains("trying again at each renewal") == true, "\(said)")
        #expect(said.dropFirst().allSatisfy { $0.contains("the leases still cannot be renewed") }, "\(said)")
        // One line at first, then one per 10 s of the outage: 12 lines only if it lasted 110 s.
        #expect(said.count <= 1 + Int(outage / .seconds(10)), "\(said.count) lines in \(outage): \(said)")
        let again = logs.texts().filter { $0.contains("renewed again") }
        #expect(again.count == 1 && again[0].contains("\"hop.failures\": \(failures)"), "\(again)")
    }

    /// A lease renewal that fails is tried again half a second later, not a third of a lease
    /// later: once the database answers again after an outage longer than a lease (every lease
    /// of the fleet has then expired), the engine renews its leases at the first chance, before
    /// another engine takes its runs as expired. Before, the next try came a third of a lease
    /// later: 3.3 s with the default lease, 20 s with a lease of a minute.
    @Test func aLeaseRenewalThatFailsIsTriedAgainHalfASecondLater() async throws {
        let folder = try TemporaryDirectory()
        // Renewals every 20 s: far apart enough that a loaded machine (CI's first minute delayed
        // a wake-up of this process by 4 s) does not blur a retry into the next renewal.
        let (storage, _, service) = try await Self.readyEngine(
            folder, configuration: .init(leaseDuration: .seconds(60)))
        defer { service.cancel() }
        let renewal = "renewLeases(owner:runIDs:until:)"
        storage.fail(renewal, times: 1)
        func renewals() -> [String] { storage.trace(of: renewal) }
        try await HopStoreTestSupport.waitUntil("the first renewal failed", timeout: .seconds(80)) {
            !renewals().isEmpty
        }
        let failed = ContinuousClock.now
        try await HopStoreTestSupport.waitUntil("a renewal after the failed one", timeout: .seconds(80)) {
            renewals().count >= 2
        }
        let gap = ContinuousClock.now - failed
        #expect(renewals().prefix(2) == ["\(renewal) (failed)", renewal], "\(renewals())")
        // Half a second; the next regular renewal would come 20 s after the failed one. The
        // bound leaves 11.5 s for a loaded machine's late wake-ups.
        #expect(gap < .seconds(12), "the failed renewal was tried again \(gap) after it")
    }

    /// The whole start-up flow, steered as an operator would (onboarding unhopped, a session
    /// stored), once for every call the engine and the steering make to the database, that call
    /// failing: wherever the database fails once, the run goes on at once (a failed command is
    /// retried, as its caller would), completes, and its history is the flow's, each hop and
    /// unhop once. A step may run again (at least once), but no run is left held by an engine
    /// that does not execute it: the leases here last a minute, past each phase's wait.
    @Test(arguments: TestBackend.all)
    func everySingleDatabaseFailureOfAFlowLeavesItsRunGoingOnAtOnce(backend: TestBackend) async throws {
        let expected = [
            "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding", "unhop onboarding",
            "effect markUsed(onboarding)", "decision session", "hop login", "unhop login", "hop main", "unhop main",
        ]
        let calls = try await Self.forEachCallFailing(on: backend, expecting: expected) { storage, engine, fault in
            let id = try await Self.retried { try await engine.start("startup").id }
            try await Self.waitUntil(engine, runs: id, "parked at onboarding \(fault)") {
                $0.status == .parked && $0.currentStep == "onboarding"
            }
            try await Self.retried { try await engine.unhop(flow: "startup", step: "onboarding") }
            try await Self.waitUntil(engine, runs: id, "parked at login \(fault)") {
                $0.status == .parked && $0.currentStep == "login"
            }
            try await Self.retried {
                _ = try await storage.storeSession(subject: "default", userID: "alice", token: "t", expiresAt: nil)
            }
            try await Self.waitUntil(engine, runs: id, "completed \(fault)") { $0.status == .completed }
            return id
        }
        #expect(calls > 20, "the flow made \(calls) calls to the database: the test reaches too few")
    }

    /// The same for a step in process that times out and a durable sleep: wherever the
    /// database fails once, the step times out once and the sleep ends once.
    @Test(arguments: TestBackend.all)
    func everySingleDatabaseFailureOfATimeoutAndASleepLeavesItsRunGoingOnAtOnce(backend: TestBackend) async throws {
        let expected = ["hop work", "timeout work", "timer nap", "hop done", "unhop done"]
        let calls = try await Self.forEachCallFailing(on: backend, expecting: expected) { storage, engine, fault in
            engine.register(
                Flow("timed", version: "1") { flow in
                    try await flow.hop(to: "work", timeout: .milliseconds(100))
                    try await flow.sleep(for: .milliseconds(100), name: "nap")
                    try await flow.hop(to: "done")
                })
            engine.register(step: "work") { _ in try await Task.sleep(for: .seconds(60)) }
            engine.register(step: "done") { _ in }
            let id = try await Self.retried { try await engine.start("timed").id }
            try await Self.waitUntil(engine, runs: id, "completed \(fault)") { $0.status == .completed }
            return id
        }
        #expect(calls > 5, "the flow made \(calls) calls to the database: the test reaches too few")
    }

    /// Runs `flow` (which returns its run) on a fresh database once for every call it makes to
    /// the database, that call failing (`fault` says which), then checks its run's history: the
    /// replayed entries `expected`, each once, and no error. Returns how many calls a run makes.
    private static func forEachCallFailing(
        on backend: TestBackend, expecting expected: [String],
        _ flow: (_ storage: FaultyStorage, _ engine: HopEngine, _ fault: String) async throws -> Int64
    ) async throws -> Int {
        var number = 1
        while true {
            let folder = try TemporaryDirectory()
            let storage = FaultyStorage(try await backend.open(folder))
            let engine = try await startupEngine(
                folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))
            storage.failCall(number: number)
            let fault = "with call \(number) failing"
            let id: Int64
            do {
                id = try await flow(storage, engine, fault)
            } catch {
                let history = (try? await storage.base.history(runID: 1, limit: nil)) ?? []
                throw TestFailure("\(error)\nhistory of run 1: \(history)\ncalls: \(storage.trace.prefix(2000))")
            }
            #expect(try await path(of: id, in: storage.base) == expected, "\(fault)")
            let history = try await storage.base.history(runID: id, limit: nil)
            #expect(!history.contains { [.error, .fail, .diverge].contains($0.kind) }, "\(fault): \(history)")
            // Once the fault is past the run's last call, every call has been failed once.
            if storage.injectedFaults == 0 { return number - 1 }
            number += 1
        }
    }

    /// `body`, tried once more if it throws (as an operator or a caller retries a failed command).
    private static func retried<T>(_ body: () async throws -> T) async throws -> T {
        do { return try await body() } catch { return try await body() }
    }

    /// Waits until run `id` holds `condition`, resuming what the engine does not execute (as
    /// its watch would), at most 10 s.
    /// The id of a start-up run of `subject` in flight as an engine that stopped leaves it:
    /// running, held by none.
    private static func runInFlight(in database: any HopStorage, subject: String = "default") async throws -> Int64 {
        try await database.startRun(
            flow: "startup", subject: subject, version: "1", owner: nil, until: nil, durability: .now
        ).run.id
    }

    private static func waitUntil(
        _ engine: HopEngine, runs id: Int64, _ what: String, _ condition: (RunRecord) -> Bool
    ) async throws {
        try await HopStoreTestSupport.waitUntil("the run is \(what)") {
            if let run = try? await engine.settled(runID: id), condition(run) { return true }
            _ = try? await engine.resumeAll()
            return false
        }
    }
}
