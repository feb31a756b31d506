import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryLogging
import Logging
import Synchronization
import Testing

@Suite struct EngineTests {
    @Test(arguments: TestBackend.all) func startupFlowRunsEndToEndAndTheSecondStartSkipsOnboardingAndLogin(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let store = engine.storage
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .parked)
        #expect(try await engine.inFlight(flow: "startup")?.step == "onboarding")
        #expect(await engine.executingCount == 0, "a parked run holds no task")

        let onboarding = try #require(try await engine.inFlight(flow: "startup"))
        try await engine.unhop(flow: "startup", token: onboarding.token, output: ["accepted": true])
        #expect(try await engine.settled(runID: run.id)?.status == .parked)
        #expect(try await engine.inFlight(flow: "startup")?.step == "login")
        #expect(try await store.storeSession(subject: "default", userID: "alice", token: "secret") == [run.id])
        try await engine.resumeAll()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await path(of: run.id, in: store) == [
                "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding", "unhop onboarding",
                "effect markUsed(onboarding)", "decision session", "hop login", "unhop login", "hop main", "unhop main",
            ])
        #expect(try await store.history(runID: run.id)[4].value == #"{"accepted":true}"#)

        let second = try await engine.start("startup")
        #expect(second.id != run.id)
        #expect(try await engine.settled(runID: second.id)?.status == .completed)
        #expect(
            try await path(of: second.id, in: store) == [
                "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "decision session", "hop main",
                "unhop main",
            ])
    }

    @Test(arguments: TestBackend.all) func unhopWithStaleTokenIsRefusedAndADoubleUnhopChangesNothing(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let run = try await engine.start("startup")
        _ = try await engine.settled(runID: run.id)
        let onboarding = try #require(try await engine.inFlight(flow: "startup"))

        let stale = await #expect(throws: HopError.self) { try await engine.unhop(flow: "startup", token: "forged") }
        #expect(stale?.code == .refused)
        try await engine.unhop(flow: "startup", token: onboarding.token)
        _ = try await engine.settled(runID: run.id)
        let twice = await #expect(throws: HopError.self) {
            try await engine.unhop(flow: "startup", token: onboarding.token)
        }
        #expect(twice?.description.contains("already unhopped") == true)
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.filter { $0.kind == .unhop && $0.step == "onboarding" }.count == 1)
        #expect(
            history.filter { $0.kind == .hop && $0.step == "login" }.count == 1,
            "the double unhop did not run the next step again")
    }

    @Test(arguments: TestBackend.all) func unhopOfACancelledRunIsRefused(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let run = try await engine.start("startup")
        _ = try await engine.settled(runID: run.id)
        let onboarding = try #require(try await engine.inFlight(flow: "startup"))
        #expect(try await engine.cancel(flow: "startup").status == .cancelled)
        let error = await #expect(throws: (any Error).self) {
            try await engine.unhop(flow: "startup", token: onboarding.token)
        }
        #expect("\(error.map { "\($0)" } ?? "")".contains("no unfinished run"))
        let refused = await #expect(throws: HopError.self) {
            try await engine.storage.recordUnhop(runID: run.id, token: onboarding.token)
        }
        #expect(refused?.description.contains("cancelled") == true)
        #expect(try await engine.storage.history(runID: run.id).last?.kind == .cancel)
    }

    /// A flow parks on "approve" twice. `engine.unhop(…, run:, entry:)` with what
    /// `engine.parking` gave for the first parking, called again after the run parked on the
    /// second (a caller's retry), changes nothing; the second parking is unhopped by its own entry.
    @Test(arguments: TestBackend.all) func anUnhopThatNamesItsParkingNeverFinishesTheNextParkingOnTheSameStep(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let review = Flow("review", version: "1") { flow in
            try await flow.hop(to: "approve")
            try await flow.hop(to: "approve")
            try await flow.hop(to: "main")
        }
        let engine = try await startupEngine(folder, backend: backend, flow: review)
        engine.register(step: "approve", .external)
        let run = try await engine.start("review")
        _ = try await engine.settled(runID: run.id)
        #expect(try await engine.parking(flow: "onboarding") == nil)
        let first = try #require(try await engine.parking(flow: "review"))
        #expect(first.run == run.id && first.step == "approve")

        // An entry needs its run; a wrong run or entry is refused, changing nothing.
        let noRun = await #expect(throws: HopError.self) {
            try await engine.unhop(flow: "review", step: "approve", entry: first.entry)
        }
        #expect(noRun?.code == .invalidInput)
        let wrongEntry = await #expect(throws: HopError.self) {
            try await engine.unhop(flow: "review", step: "approve", run: run.id, entry: first.entry + 1)
        }
        #expect(wrongEntry?.code == .notFound)

        try await engine.unhop(flow: "review", step: "approve", run: run.id, entry: first.entry)
        let second = try #require(try await engine.settled(runID: run.id))
        #expect(second.status == .parked && second.currentStep == "approve")
        let parked = try #require(try await engine.parking(flow: "review"))
        #expect(parked.entry > first.entry)

        let retry = await #expect(throws: HopError.self) {
            try await engine.unhop(flow: "review", step: "approve", run: run.id, entry: first.entry)
        }
        #expect(retry?.code == .refused)
        #expect(retry?.description.contains("has already unhopped") == true, "\(String(describing: retry))")
        #expect(try await engine.storage.run(id: run.id)?.currentToken == second.currentToken)

        try await engine.unhop(flow: "review", step: "approve", run: run.id, entry: parked.entry)
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await path(of: run.id, in: engine.storage) == [
                "hop approve", "unhop approve", "hop approve", "unhop approve", "hop main", "unhop main",
            ])
    }

    @Test(arguments: TestBackend.all) func cancellingARunCancelsTheTaskOfItsStepInFlight(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let entered = Mutex(false)
        engine.register(step: "splash") { _ in
            entered.withLock { $0 = true }
            try await Task.sleep(for: .seconds(600))
        }
        let run = try await engine.start("startup")
        try await waitUntil("splash is entered") { entered.withLock { $0 } }
        try await engine.cancel(flow: "startup")
        let settled = try await engine.settled(runID: run.id)
        #expect(settled?.status == .cancelled)
        #expect(try await path(of: run.id, in: engine.storage) == ["hop splash"])
    }

    @Test(arguments: TestBackend.all) func flowCodeThatNoLongerMatchesTheHistoryMarksTheRunDivergedAndDoesNotAdvance(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let first = try await startupEngine(folder, backend: backend)
        let run = try await first.start("startup")
        _ = try await first.settled(runID: run.id)

        // The code changed without a new version (a new version would leave the run on its own).
        let changed = Flow("startup", version: "1") { flow in
            try await flow.hop(to: "splash")
            try await flow.hop(to: "main")
        }
        let second = try await startupEngine(folder, backend: backend, flow: changed)
        _ = try await second.storage.unhopParked(flow: "startup", subject: "default", step: "onboarding", output: nil)
        try await second.resumeAll()
        let settled = try #require(try await second.settled(runID: run.id))
        #expect(settled.status == .diverged)
        let entry = try #require(try await second.storage.history(runID: run.id).last)
        #expect(entry.kind == .diverge)
        let message = entry.value ?? ""
        for part in [
            "decision 'isFirstUse(onboarding)'", "hop to 'main'", "version 1; the run started with version 1",
            "hopctl restart --flow startup --subject default",
        ] {
            #expect(message.contains(part), "\(message)")
        }
        #expect(!(try await path(of: run.id, in: second.storage)).contains("hop main"))
    }

    @Test(arguments: TestBackend.all) func aStepThatThrowsIsRetriedAndFailsTheRunWithItsErrorAfterTheLastAttempt(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let attempts = Mutex(0)
        engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(1))) { _ in
            attempts.withLock { $0 += 1 }
            throw CacheError()
        }
        let run = try await engine.start("startup")
        let settled = try #require(try await engine.settled(runID: run.id))
        #expect(settled.status == .failed)
        #expect(attempts.withLock { $0 } == 3)
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .error, .error, .fail])
        #expect(history.last?.value?.contains("attempt 3 of 3: the cache is unreadable") == true)
    }

    @Test(arguments: TestBackend.all) func aStepThatThrowsThenSucceedsCompletesTheRun(backend: TestBackend) async throws
    {
        let folder = try TemporaryDirectory()
        let engine = try await startupEngine(folder, backend: backend)
        let attempts = Mutex(0)
        engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(1))) { step in
            if attempts.withLock({
                $0 += 1
                return $0
            }) < 3 {
                throw CacheError()
            }
            #expect(step.attempt == 3)
        }
        try await engine.storage.markUsed(subject: "default", feature: "onboarding")
        try await engine.storage.storeSession(subject: "default", userID: "alice", token: "t")
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(try await engine.storage.history(runID: run.id).filter { $0.kind == .error }.count == 2)
    }

    @Test(arguments: TestBackend.all) func theTransitionHookFinishesBeforeTheHopCountsAsEntered(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let seen = Mutex<[String]>([])
        let holder = Mutex<(any HopStorage)?>(nil)
        let flow = startupFlow { transition in
            let store = try #require(holder.withLock { $0 })
            let recorded = try await store.history(runID: transition.runID).filter { $0.kind == .hop }.map {
                $0.step ?? ""
            }
            #expect(
                !recorded.contains(transition.to),
                "the hop to \(transition.to) was recorded before its transition finished")
            seen.withLock { $0.append("\(transition.from ?? "start")→\(transition.to)") }
        }
        let engine = try await startupEngine(folder, backend: backend, flow: flow)
        holder.withLock { $0 = engine.storage }
        try await engine.storage.markUsed(subject: "default", feature: "onboarding")
        try await engine.storage.storeSession(subject: "default", userID: "alice", token: "t")
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(seen.withLock { $0 } == ["start→splash", "splash→main"])
        let transitions = try await engine.storage.history(runID: run.id).filter { $0.kind == .transition }
        #expect(transitions.map { "\($0.value ?? "")→\($0.step ?? "")" } == ["splash→main"])
    }

    @Test(arguments: TestBackend.all) func aStepReachesItsRunsStateAndItsOutputIsTheHopsResult(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let engine = HopEngine(
            storage: store, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        struct Terms: Codable, Equatable { var version: Int }
        let result = Mutex<Terms?>(nil)
        engine.register(
            Flow("terms", version: "1") { flow in
                let terms = try await flow.hop(to: "read-terms", as: Terms.self)
                result.withLock { $0 = terms }
                #expect(try await flow.fact("terms-version") == "3")
            })
        engine.register(step: "read-terms") { step in
            #expect(step.flow == "terms" && step.subject == "kiosk-1" && step.attempt == 1 && !step.isReentry)
            try await step.setFact("terms-version", "3")
            try await step.unhop(output: Terms(version: 3))
        }
        let run = try await engine.start("terms", subject: "kiosk-1")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(result.withLock { $0 } == Terms(version: 3))
    }

    @Test(arguments: TestBackend.all) func anUnregisteredStepFailsTheRunWithAMessageSayingWhatToRegister(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let engine = HopEngine(
            storage: store, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(Flow("f", version: "1") { flow in try await flow.hop(to: "nowhere") })
        let run = try await engine.start("f")
        #expect(try await engine.settled(runID: run.id)?.status == .failed)
        #expect(
            try await store.history(runID: run.id).last?.value?.contains("engine.register(step: \"nowhere\")") == true)
        await #expect(throws: HopError.self) { try await engine.start("unknown-flow") }
    }

    @Test(arguments: TestBackend.all) func tokensAndOutputsNeverReachLogsAboveDebug(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        var logger = logs.logger(label: "test")
        logger.logLevel = .trace
        let engine = try await startupEngine(folder, backend: backend, logger: logger)
        engine.register(step: "splash") { step in try await step.unhop(output: ["secret": "output-secret-42"]) }
        let run = try await engine.start("startup")
        _ = try await engine.settled(runID: run.id)
        let onboarding = try #require(try await engine.inFlight(flow: "startup"))
        try await engine.unhop(flow: "startup", token: onboarding.token)
        _ = try await engine.settled(runID: run.id)
        try await engine.storage.storeSession(subject: "default", userID: "alice", token: "session-secret-77")
        try await engine.resumeAll()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        let visible = logs.texts(atLeast: .info)
        #expect(!visible.isEmpty)
        for line in visible {
            #expect(
                !line.contains("output-secret-42") && !line.contains("session-secret-77")
                    && !line.contains(onboarding.token))
        }
    }

    @Test func aRetentionWhoseFlowIsNoNameIsRefusedOnceAndTheEngineRunsOn() async throws {
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await HopStore.open(path: folder.database)
        let engine = HopEngine(
            store: store, logger: logs.logger(label: "test"),
            configuration: .init(retention: .init(finishedAfter: .zero, flow: "", interval: .zero)))
        registerInstantStartup(on: engine)
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await waitUntil("the engine says retention is off", timeout: .seconds(30)) {
            logs.texts(atLeast: .error).contains { $0.contains("retention is off") && $0.contains("flow name") }
        }
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(logs.texts(atLeast: .error).count == 1, "said once, not at every (zero) interval")
        try await waitUntil("the engine says it is running", timeout: .seconds(30)) {
            logs.texts(atLeast: .info).contains { $0.contains("engine running") }
        }
        let said = logs.texts(atLeast: .info)
        let order = ["retention is off", "engine running"].map { text in said.firstIndex { $0.contains(text) } ?? -1 }
        #expect(order[0] >= 0 && order[0] < order[1], "refused before the runs are resumed: \(said)")
    }

    /// A negative age or number of runs to keep is a mistake, not "keep none": taken as zero, a
    /// negative age removed every run as soon as it finished, a negative `keepLast` each
    /// subject's latest run.
    @Test(arguments: [
        (HopEngine.Retention(finishedAfter: .zero, keepLast: -1, interval: .zero), "keepLast"),
        (HopEngine.Retention(finishedAfter: .seconds(-60), keepLast: 0, interval: .zero), "finishedAfter"),
    ])
    func aRetentionThatKeepsANegativeNumberOrAgeIsRefusedAndRemovesNothing(
        retention: HopEngine.Retention, setting: String
    ) async throws {
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await HopStore.open(path: folder.database)
        // Two finished runs of the subject: a prune keeping none would remove the older at once.
        var finished: [Int64] = []
        for _ in 0..<2 {
            finished.append(try await store.startRun(flow: "startup", subject: "default", version: "1").run.id)
            try await store.cancelRun(flow: "startup", subject: "default", runID: nil, reason: "test")
        }
        let engine = HopEngine(
            store: store, logger: logs.logger(label: "test"), configuration: .init(retention: retention))
        registerInstantStartup(on: engine)
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        try await waitUntil("the engine says retention is off", timeout: .seconds(30)) {
            logs.texts(atLeast: .error).contains { $0.contains("retention is off") && $0.contains(setting) }
        }
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        for id in finished { #expect(try await store.run(id: id)?.status == .cancelled, "run \(id) is kept") }
        #expect(logs.texts(atLeast: .error).count == 1, "\(logs.texts(atLeast: .error))")
    }
}

/// Settings that cannot work are taken as the nearest that can, each said once: a poll interval
/// or a lease of zero had the watch or the renewals loop without pause, and no place for a run
/// left every run waiting for ever.
@Suite struct ConfigurationTests {
    @Test func aConfigurationThatCannotWorkIsAdjustedAndSaid() async throws {
        let folder = try TemporaryDirectory()
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await HopStore.open(path: folder.database)
        let storage = FaultyStorage(store)
        let engine = HopEngine(
            storage: storage, logger: logs.logger(label: "test"),
            configuration: .init(pollInterval: .zero, leaseDuration: .zero, maxConcurrentRuns: 0))
        registerInstantStartup(on: engine)
        let warnings = logs.texts(atLeast: .warning)
        for setting in ["pollInterval", "leaseDuration", "maxConcurrentRuns"] {
            #expect(warnings.contains { $0.contains("configuration: \(setting)") }, "\(warnings)")
        }
        let service = Task { try await engine.run() }
        defer { service.cancel() }
        let run = try await engine.start("startup")
        try await waitUntil("the run completes", timeout: .seconds(30)) {
            try await store.run(id: run.id)?.status == .completed
        }

        // 20 polls take at least 19 of the shortest interval (a loaded machine only takes longer).
        let began = ContinuousClock.now
        let polls = storage.calls("changeVersion()")
        let renewals = storage.calls("renewLeases(owner:runIDs:until:)")
        try await waitUntil("the watch polls 20 times more", timeout: .seconds(60)) {
            storage.calls("changeVersion()") >= polls + 20
        }
        let took = ContinuousClock.now - began
        #expect(took >= HopEngine.Configuration.shortestPollInterval * 19, "20 polls in \(took)")
        let renewed = storage.calls("renewLeases(owner:runIDs:until:)") - renewals
        #expect(Double(renewed) <= took / HopEngine.Configuration.shortestLeaseDuration * 3 + 2, "\(renewed) renewals")
    }
}

struct CacheError: Error, CustomStringConvertible {
    var description: String { "the cache is unreadable" }
}

/// Daemon code that blocks its thread, beside another run.
@Suite struct WhereCodeRunsTests {
    /// A flow body runs on the SQLite store's thread while few runs execute, on the pool when
    /// many do (`crowded`: 8 runs wait in a step); a step, a `decide` read and a transition hook
    /// are the daemon's code and run on the cooperative pool either way, and so does the code
    /// that called `engine.start` once the start returns (`caller`). If any of them ran on the
    /// store's thread, blocking it would stop every other run's reads and records until it returned.
    ///
    /// Each case runs in a process of its own (`hop-test-blocking`), whose pool has two threads
    /// on two cores: blocking one of the test process's left every other test one thread while
    /// the case lasted, and their engines' polls came tens of seconds late.
    @Test(arguments: ["step", "decision", "transition", "caller"], [false, true])
    func daemonCodeThatBlocksItsThreadDoesNotHoldUpAnotherRunsDatabaseWork(
        blocking: String, crowded: Bool
    )
        async throws
    {
        let folder = try TemporaryDirectory()
        let ran = try await run(
            "hop-test-blocking", ["--db", folder.database, "--blocking", blocking] + (crowded ? ["--crowded"] : []),
            in: folder, timeout: .seconds(180))
        #expect(ran.status == 0, "\(ran.stdout)\(ran.stderr)")
        #expect(ran.stdout.contains("blocking\n"), "the blocking code never ran: \(ran.stdout)\(ran.stderr)")
        #expect(
            ran.stdout.contains("quick completed while blocked"),
            "the quick run completed only after the blocking code returned: \(ran.stdout)\(ran.stderr)")
        #expect(ran.stdout.contains("blocking run completed"), "\(ran.stdout)\(ran.stderr)")
    }
}

/// `settled(runID:)`: whoever waits for a run gets it as stored once its execution ended.
@Suite struct SettledTests {
    /// 20 runs at once, so that the first bodies run beside the store and the later ones on the
    /// pool; two callers wait for each, and an observer (when there is one) is told the same.
    @Test(arguments: TestBackend.all, [false, true])
    func everyCallerWaitingForARunGetsItAsItEndedWhereverItsBodyRan(
        backend: TestBackend, observed: Bool
    ) async throws {
        let folder = try TemporaryDirectory()
        let told = Told()
        let engine = HopEngine(
            storage: try await backend.open(folder),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            configuration: .init(observer: observed ? told.observe : nil))
        let gate = Gate()
        engine.register(Flow("settle", version: "1") { flow in try await flow.hop(to: "work") })
        engine.register(step: "work") { _ in await gate.wait() }
        var runs: [RunRecord] = []
        for index in 0..<20 { runs.append(try await engine.start("settle", subject: "s\(index)")) }
        let results = try await withThrowingTaskGroup(of: (Int64, RunRecord?).self) { group in
            for run in runs {
                for _ in 0..<2 { group.addTask { (run.id, try await engine.settled(runID: run.id)) } }
            }
            gate.open()
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.count == 40)
        for (runID, settled) in results {
            let stored = try await engine.storage.run(id: runID)
            #expect(settled?.status == .completed, "run \(runID) settled as \(String(describing: settled?.status))")
            #expect(settled == stored, "a caller got run \(runID) other than as it is stored")
        }
        if observed {
            let seen = told.runs
            for run in runs { #expect(seen[run.id]?.status == .completed, "the observer was not told run \(run.id)") }
        }
    }

    /// The runs an observer was told settled, by id.
    final class Told: Sendable {
        private let state = Mutex<[Int64: RunRecord]>([:])
        @Sendable func observe(_ event: EngineEvent) {
            if case .settled(let run) = event { state.withLock { $0[run.id] = run } }
        }
        var runs: [Int64: RunRecord] { state.withLock { $0 } }
    }
}

/// A daemon may call the engine from a task that prefers an executor of its own, as a server's
/// handlers prefer their SwiftNIO event loop: every call answers as from anywhere else.
@Suite struct CallerExecutorTests {
    /// A task executor on a serial dispatch queue, standing in for an event loop.
    final class QueueExecutor: TaskExecutor, @unchecked Sendable {
        // @unchecked: its only state is the queue, which is thread-safe.
        private let queue = DispatchQueue(label: "hop.test.caller-executor")

        func enqueue(_ job: consuming ExecutorJob) {
            let job = UnownedJob(job)
            queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
        }
    }

    /// 200 runs started at once and waited for, all from tasks that prefer the queue. A start
    /// waits for the commit that holds its run; a start that missed that commit's end (the
    /// store had moved on between checking for the commit and waiting for it) never returned.
    @Test(arguments: TestBackend.all)
    func startAndSettledReturnWhenCalledFromATaskThatPrefersItsOwnExecutor(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let engine = HopEngine(
            storage: try await backend.open(folder),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(Flow("quick", version: "1") { flow in try await flow.hop(to: "instant") })
        engine.register(step: "instant") { _ in }
        let runs = 200
        final class Counts: Sendable {
            let returned = Atomic<Int>(0)
            let completed = Atomic<Int>(0)
        }
        let counts = Counts()
        let callers = Task(executorPreference: QueueExecutor()) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<runs {
                    group.addTask {  // a child task keeps its parent's preference
                        let run = try await engine.start("quick", subject: "caller-\(index)")
                        counts.returned.add(1, ordering: .relaxed)
                        if try await engine.settled(runID: run.id)?.status == .completed {
                            counts.completed.add(1, ordering: .relaxed)
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        // A start that never returns stops the count short of 200. Under the whole suite the
        // starts come slowly (PostgreSQL's took 29 s here), so what fails is 30 s without
        // another start returning, not a deadline for all of them.
        var returned = 0
        while returned < runs {
            let before = returned
            do {
                try await waitUntil("another start returns (\(before) of \(runs) did)", timeout: .seconds(30)) {
                    counts.returned.load(ordering: .relaxed) > before
                }
            } catch {
                callers.cancel()
                throw error
            }
            returned = counts.returned.load(ordering: .relaxed)
        }
        try await callers.value
        #expect(counts.completed.load(ordering: .relaxed) == runs)
    }

    /// `hopctl status --subject` without a flow, and the flow names hopctl lists: both searched
    /// by flow in the index (RunHistoryTests checks the plan); here, that they find the same.
    @Test(arguments: TestBackend.all) func flowNamesAndASubjectsNewestRunsAcrossFlows(backend: TestBackend) async throws
    {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        #expect(try await store.flowNames().isEmpty)
        #expect(try await store.runs(flow: nil, subject: "kiosk-1", limit: 10).isEmpty)
        for (flow, subject) in [
            ("startup", "kiosk-1"), ("archive", "kiosk-2"), ("update", "kiosk-1"), ("archive", "kiosk-1"),
        ] {
            _ = try await store.startRun(flow: flow, subject: subject, version: "1")
        }
        let newest = try await store.restartRun(flow: "archive", subject: "kiosk-1", runID: nil, version: nil)
        #expect(try await store.flowNames() == ["archive", "startup", "update"])
        let runs = try await store.runs(flow: nil, subject: "kiosk-1", limit: 10)
        #expect(runs.map(\.flow) == ["archive", "startup", "update"])
        #expect(runs.allSatisfy { $0.subject == "kiosk-1" })
        #expect(runs.first?.id == newest.id, "the newest run of the flow for the subject")
        #expect(try await store.runs(flow: nil, subject: "kiosk-1", limit: 2).map(\.flow) == ["archive", "startup"])
        #expect(try await store.runs(flow: nil, subject: "kiosk-3", limit: 10).isEmpty)
        #expect(try await store.runs(flow: nil, subject: nil, limit: 10).count == 4)
    }

    /// `hopctl status` with every combination of filters and limits, on every backend: the
    /// newest run of each flow and subject whose newest run has the status asked for, in order
    /// of flow and subject, at most the limit; the same as reading every run and choosing by hand.
    /// (A status was once applied after the limit, by hopctl: runs past the first 1,000 flows
    /// and subjects were never listed.)
    @Test(arguments: TestBackend.all) func aStatusListingIsTheNewestRunOfEachFlowAndSubjectWithThatStatus(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        func start(_ flow: String, _ subject: String) async throws -> Int64 {
            try await store.startRun(flow: flow, subject: subject, version: "1").run.id
        }
        func complete(_ runID: Int64) async throws { try await store.record(.complete, runID: runID) }
        // Pairs whose older runs have another status than their newest: only the newest counts.
        try await complete(try await start("startup", "a"))
        try await store.recordHop(runID: try await start("startup", "a"), step: "login", parks: true)
        _ = try await start("startup", "b")
        try await store.cancelRun(flow: "startup", subject: "b", runID: nil, reason: "test")
        try await complete(try await start("startup", "b"))
        _ = try await start("startup", "c")
        try await store.divergeRun(runID: try await start("archive", "a"), step: "s", message: "changed", owner: nil)
        try await store.recordHop(runID: try await start("archive", "c"), step: "login", parks: true)
        _ = try await start("update", "b")
        try await store.cancelRun(flow: "update", subject: "b", runID: nil, reason: "test")

        var newest: [RunRecord] = []
        for flow in try await store.flowNames() {
            let runs = try await store.allRuns(flow: flow)
            newest += Dictionary(grouping: runs, by: \.subject).values.compactMap { $0.max { $0.id < $1.id } }
        }
        newest.sort { ($0.flow, $0.subject) < ($1.flow, $1.subject) }
        #expect(newest.count == 6)
        var checked = 0
        for flow in [nil, "startup", "archive", "nosuch"] {
            for subject in [nil, "a", "b", "c", "nosuch"] {
                for status in [nil] + RunStatus.allCases {
                    let expected = newest.filter {
                        (flow == nil || $0.flow == flow) && (subject == nil || $0.subject == subject)
                            && (status == nil || $0.status == status)
                    }
                    for limit in [1, 2, 100] {
                        let listed = try await store.runs(flow: flow, subject: subject, status: status, limit: limit)
                        #expect(
                            listed.map(\.id) == expected.prefix(limit).map(\.id),
                            "flow \(flow ?? "-"), subject \(subject ?? "-"), status \(status?.rawValue ?? "-"), limit \(limit)"
                        )
                        checked += expected.isEmpty ? 0 : 1
                    }
                }
            }
        }
        #expect(checked > 90)
    }

    /// `hopctl graph`: every backend counts the same edges, in the same order, from runs that
    /// executed at once (their history entries interleaved), and none of another flow's.
    @Test(arguments: TestBackend.all) func theHopGraphCountsEachRunsEdgesInOrder(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let paths = [
            "a": ["splash", "onboarding", "main"], "b": ["splash", "main"], "c": ["splash", "main", "main"],
        ]
        engine.register(
            Flow("tour", version: "1") { flow in
                for step in paths[flow.subject] ?? [] { try await flow.hop(to: step) }
            })
        engine.register(Flow("other", version: "1") { flow in for _ in 0..<3 { try await flow.hop(to: "splash") } })
        for step in ["splash", "onboarding", "main"] { engine.register(step: step) { _ in await Task.yield() } }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (flow, subject) in [("tour", "a"), ("tour", "b"), ("tour", "c"), ("other", "a")] {
                group.addTask {
                    let run = try await engine.start(flow, subject: subject)
                    #expect(try await engine.settled(runID: run.id)?.status == .completed)
                }
            }
            try await group.waitForAll()
        }
        #expect(
            try await storage.hopGraph(flow: "tour") == [
                HopEdge.counted(from: nil, to: "splash", count: 3),
                HopEdge.counted(from: "splash", to: "main", count: 2),
                HopEdge.counted(from: "main", to: "main", count: 1),
                HopEdge.counted(from: "onboarding", to: "main", count: 1),
                HopEdge.counted(from: "splash", to: "onboarding", count: 1),
            ])
        #expect(
            try await storage.hopGraph(flow: "other") == [
                HopEdge.counted(from: "splash", to: "splash", count: 2),
                HopEdge.counted(from: nil, to: "splash", count: 1),
            ])
        #expect(try await storage.hopGraph(flow: "none").isEmpty)
    }

    /// `hopctl history --all-runs` reads a flow's runs a page at a time: on every backend, the
    /// pages hold every run of the flow once, in order, and none of another flow's.
    @Test(arguments: TestBackend.all)
    func aFlowsRunsReadAPageAtATimeAreEachRunOnceInOrder(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        var expected: [Int64] = []
        for index in 0..<7 {
            expected.append(try await storage.startRun(flow: "tour", subject: "s\(index)", version: "1").run.id)
            _ = try await storage.startRun(flow: "other", subject: "s\(index)", version: "1")
        }
        var pages: [[Int64]] = []
        var after = Int64.min
        while pages.count < 10 {  // a page that repeats its predecessor's last run would never end
            let page = try await storage.allRuns(flow: "tour", after: after, limit: 3).map(\.id)
            pages.append(page)
            guard let last = page.last else { break }
            after = last
        }
        #expect(pages == [Array(expected[0..<3]), Array(expected[3..<6]), [expected[6]], []])
        #expect(try await storage.allRuns(flow: "tour").map(\.id) == expected)
    }
}
