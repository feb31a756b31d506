import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryTracing
import Logging
import Synchronization
import Testing

/// A step that returns without unhopping is unhopped with its run's next record, in one write
/// (`HeldUnhops.swift`): one check of the run, one update of its row. What that must leave as
/// two writes would, and what it must not delay.
@Suite struct HeldUnhopTests {
    static let quiet = Logger(label: "held-unhop", factory: { _ in SwiftLogNoOpLogHandler() })

    /// The records a run's next write can be, after a step's unhop.
    static let nextWrites: [RunWrite] = [
        .hop(step: "second", from: nil, parks: false, wakeOn: nil, deadline: nil),
        .hop(step: "second", from: "first", parks: false, wakeOn: nil, deadline: nil),
        .hop(step: "second", from: nil, parks: true, wakeOn: nil, deadline: Date().addingTimeInterval(600)),
        .decision(name: "plan", value: #"{"tier":2}"#),
        .patch(name: "new-terms"),
        .timer(name: "backoff", deadline: Date().addingTimeInterval(600)),
        .markUsed(feature: "onboarding"),
        .complete,
    ]

    /// A run of subject `subject` held by "engine" with its step "first" in flight; returns it
    /// and the step's token.
    static func runInFirstStep(
        _ store: any HopAdministration, subject: String
    ) async throws -> (run: RunRecord, token: String) {
        let run = try await store.startRun(flow: "f", subject: subject, version: "1").run
        _ = try await store.claim(runID: run.id, owner: "engine", until: Date().addingTimeInterval(600))
        let hop = try await store.recordHop(runID: run.id, step: "first", owner: "engine")
        return (run, try #require(hop.token))
    }

    /// What a history entry says, without its time, token and timer value (those differ between runs).
    static func shape(_ entry: HistoryEntry) -> String {
        "\(entry.seq) \(entry.kind.rawValue) \(entry.step ?? "-") \(entry.kind == .timer ? "" : entry.value ?? "-")"
    }

    /// What a run's row says, without its token's value.
    static func shape(_ run: RunRecord?) -> String {
        guard let run else { return "none" }
        return
            "\(run.status.rawValue) step=\(run.currentStep ?? "-") token=\(run.currentToken != nil) owner=\(run.owner ?? "-") wake=\(run.wakeOn?.rawValue ?? "-") \(run.wakeAt != nil)"
    }

    /// A task a step leaves behind that unhops the step once `gate` opens; its value is the
    /// refusal's code (`nil` when the unhop was taken).
    static func unhop(_ context: StepContext, after gate: Gate) -> Task<HopError.Code?, Never> {
        Task {
            await gate.wait()
            do {
                try await context.unhop()
                return nil
            } catch let error as HopError {
                return error.code
            } catch {
                return .invalidInput
            }
        }
    }

    /// An engine on a new database in `folder` that runs the flow "pair": a hop to "first"
    /// (whose body is `first`), then `between` with the body's context and first's output,
    /// then a hop to "second".
    static func pairEngine(
        _ folder: TemporaryDirectory, commitDelay: Duration? = nil,
        configuration: HopEngine.Configuration = HopEngine.Configuration(),
        first: @escaping @Sendable (StepContext) async throws -> Void = { _ in },
        between: @escaping @Sendable (_ flow: FlowContext, _ firstOutput: String?) async throws -> Void = { _, _ in }
    ) async throws -> HopEngine {
        var options = HopStore.Options()
        if let commitDelay { options.commitDelay = commitDelay }
        let engine = HopEngine(
            store: try await HopStore.open(path: folder.database, options: options), logger: quiet,
            configuration: configuration)
        engine.register(
            Flow("pair", version: "1") { flow in
                try await between(flow, try await flow.hop(to: "first", as: String.self))
                try await flow.hop(to: "second")
            })
        engine.register(step: "first", first)
        engine.register(step: "second") { _ in }
        return engine
    }

    @Test(arguments: TestBackend.all, nextWrites)
    func anUnhopWrittenWithTheRunsNextRecordLeavesWhatTwoWritesLeave(backend: TestBackend, next: RunWrite) async throws
    {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let (together, togetherToken) = try await Self.runInFirstStep(store, subject: "together")
        let (apart, apartToken) = try await Self.runInFirstStep(store, subject: "apart")

        let both = try await store.record(
            [.unhop(token: togetherToken, output: nil), next], runID: together.id, owner: "engine", durability: .now)
        let unhop = try await store.record(
            .unhop(token: apartToken, output: nil), runID: apart.id, owner: "engine", durability: .now)
        let second = try await store.record(next, runID: apart.id, owner: "engine", durability: .now)

        #expect(both.map(Self.shape) == [unhop, second].map(Self.shape))
        #expect(
            try await store.history(runID: together.id).map(Self.shape)
                == store.history(runID: apart.id).map(Self.shape))
        #expect(try await Self.shape(store.run(id: together.id)) == Self.shape(store.run(id: apart.id)))
    }

    /// Refused or invalid, the pair changes nothing: neither the unhop nor the record after it.
    @Test(arguments: TestBackend.all)
    func anUnhopWithTheNextRecordIsRefusedWholeAndChangesNothing(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let (run, token) = try await Self.runInFirstStep(store, subject: "s")
        let hop = RunWrite.hop(step: "second", from: nil, parks: false, wakeOn: nil, deadline: nil)

        func expectNothingChanged(
            by writes: [RunWrite], owner: String, _ code: HopError.Code, _ what: String
        ) async throws {
            let history = try await store.history(runID: run.id).map(Self.shape)
            let row = try await Self.shape(store.run(id: run.id))
            let error = await #expect(throws: HopError.self, "\(what)") {
                try await store.record(writes, runID: run.id, owner: owner, durability: .now)
            }
            #expect(error?.code == code, "\(what): \(error.map { "\($0)" } ?? "")")
            #expect(try await store.history(runID: run.id).map(Self.shape) == history, "\(what)")
            #expect(try await Self.shape(store.run(id: run.id)) == row, "\(what)")
        }

        try await expectNothingChanged(
            by: [.unhop(token: "stale", output: nil), hop], owner: "engine", .refused, "a stale token")
        try await expectNothingChanged(
            by: [.unhop(token: token, output: nil), hop], owner: "other", .refused, "another engine")
        try await expectNothingChanged(
            by: [.unhop(token: token, output: nil), .decision(name: "plan", value: "{not json")], owner: "engine",
            .invalidInput, "an invalid decision after the unhop")
        #expect(try await store.run(id: run.id)?.currentStep == "first")
        _ = try await store.cancelRun(flow: "f", subject: "s", runID: nil, reason: "test")
        try await expectNothingChanged(
            by: [.unhop(token: token, output: nil), .complete], owner: "engine", .refused, "a cancelled run")
    }

    /// One write: both records are announced before either is recorded, whether the step
    /// returned without unhopping or unhopped itself (with an output) before it returned.
    @Test(arguments: [false, true])
    func aStepThatReturnsOrUnhopsIsUnhoppedWithTheRunsNextRecordInOneWrite(unhopsItself: Bool) async throws {
        let folder = try TemporaryDirectory()
        let events = Mutex<[String]>([])
        var configuration = HopEngine.Configuration(observer: { event in
            switch event {
            case .willRecord(_, let kind, let step): events.withLock { $0.append("will \(kind) \(step ?? "-")") }
            case .recorded(_, let entry): events.withLock { $0.append("did \(entry.kind) \(entry.step ?? "-")") }
            default: break
            }
        })
        // Held until the body's next record, however busy the machine (the sweep is tested below).
        configuration.heldUnhopLimit = .seconds(600)
        let engine = try await Self.pairEngine(
            folder, configuration: configuration,
            first: { context in if unhopsItself { try await context.unhop(output: "own") } })
        let run = try await engine.start("pair")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            events.withLock { $0 } == [
                "will hop first", "did hop first",
                "will unhop first", "will hop second", "did unhop first", "did hop second",
                "will unhop second", "will complete -", "did unhop second", "did complete -",
            ])
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
        #expect(history[1].value == (unhopsItself ? #""own""# : nil))
    }

    /// A step that unhops and goes on running: its unhop does not wait for the step's return
    /// (the body does), it is written and committed within milliseconds.
    @Test func aStepThatUnhopsAndRunsOnHasItsUnhopDurableWithinMilliseconds() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let engine = try await Self.pairEngine(
            folder,
            first: { context in
                try await context.unhop(output: "own")
                await gate.wait()
            })
        let run = try await engine.start("pair")
        let elsewhere = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        try await waitUntil("another process sees the running step's unhop") {
            try await elsewhere.history(runID: run.id).map(\.kind) == [.hop, .unhop]
        }
        #expect(try await elsewhere.history(runID: run.id).last?.value == #""own""#)
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    /// A step unhops once: a second unhop is refused at once and changes nothing, the first
    /// one's output stands.
    @Test func aStepsSecondUnhopIsRefusedAndTheFirstStands() async throws {
        let folder = try TemporaryDirectory()
        let second = Mutex<HopError.Code?>(nil)
        let outputs = Mutex<[String?]>([])
        let engine = try await Self.pairEngine(
            folder,
            first: { context in
                try await context.unhop(output: "first")
                do {
                    try await context.unhop(output: "second")
                } catch let error as HopError {
                    second.withLock { $0 = error.code }
                }
            }
        ) { _, output in outputs.withLock { $0.append(output) } }
        let run = try await engine.start("pair")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(second.withLock { $0 } == .refused)
        #expect(outputs.withLock { $0 } == ["first"])
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
        #expect(history[1].value == #""first""#)
    }

    /// A step that timed out cannot unhop afterwards (from a task it left behind): refused,
    /// and the run goes on along its timeout branch, the step not ended twice.
    @Test func aStepThatTimedOutCannotUnhopAfterwards() async throws {
        let folder = try TemporaryDirectory()
        let engine = HopEngine(store: try await HopStore.open(path: folder.database), logger: Self.quiet)
        let late = Mutex<Task<HopError.Code?, Never>?>(nil)
        let timedOut = Gate()
        let gate = Gate()
        engine.register(
            Flow("slow", version: "1") { flow in
                if try await flow.hop(to: "first", timeout: .milliseconds(50)).timedOut {
                    timedOut.open()
                    await gate.wait()
                }
                try await flow.hop(to: "second")
            })
        engine.register(step: "first") { context in
            late.withLock { $0 = Self.unhop(context, after: timedOut) }
            try await Task.sleep(for: .seconds(600))  // cancelled at the deadline
        }
        engine.register(step: "second") { _ in }
        let run = try await engine.start("slow")
        await timedOut.wait()
        let task = try #require(late.withLock { $0 })
        #expect(await task.value == .refused)
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await engine.storage.history(runID: run.id).map(\.kind) == [.hop, .timeout, .hop, .unhop, .complete])
    }

    /// A body that awaits something of its own between two steps (no record) does not keep the
    /// first step's end waiting: it is written, and committed, within milliseconds.
    @Test func whileTheBodyAwaitsSomethingElseTheUnhopIsDurableWithinMilliseconds() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let engine = try await Self.pairEngine(folder, between: { _, _ in await gate.wait() })
        let run = try await engine.start("pair")
        let elsewhere = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        try await waitUntil("another process sees the first step's unhop") {
            try await elsewhere.history(runID: run.id).map(\.kind) == [.hop, .unhop]
        }
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await elsewhere.history(runID: run.id).map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
    }

    /// `makeDurable()` right after a step's end commits it at once, though no record came since
    /// (the hold limit and the store's commit delay are longer than the test): in the step,
    /// after its own unhop, as the step runs on (`inStep`); or in the body, after the step
    /// returned.
    @Test(arguments: [false, true])
    func makeDurableCommitsTheStepsEnd(inStep: Bool) async throws {
        let folder = try TemporaryDirectory()
        var configuration = HopEngine.Configuration()
        configuration.heldUnhopLimit = .seconds(600)
        let gate = Gate()
        let madeDurable = Gate()
        let engine = try await Self.pairEngine(
            folder, commitDelay: .seconds(600), configuration: configuration,
            first: { context in
                guard inStep else { return }
                try await context.unhop(output: "own")
                try await context.makeDurable()
                madeDurable.open()
                await gate.wait()
            },
            between: { flow, _ in
                guard !inStep else { return }
                try await flow.makeDurable()
                madeDurable.open()
                await gate.wait()
            })
        let run = try await engine.start("pair")
        await madeDurable.wait()
        let elsewhere = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        let history = try await elsewhere.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop])
        #expect(history.last?.value == (inStep ? #""own""# : nil))
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    /// `engine.makeDurable()` commits the ends of the steps that returned, held or not.
    @Test func engineMakeDurableCommitsTheEndsOfStepsThatReturned() async throws {
        let folder = try TemporaryDirectory()
        let gate = Gate()
        let returned = Gate()
        let engine = try await Self.pairEngine(
            folder, commitDelay: .seconds(600),
            between: { _, _ in
                returned.open()
                await gate.wait()
            })
        let run = try await engine.start("pair")
        await returned.wait()
        try await engine.makeDurable()
        let elsewhere = try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
        #expect(try await elsewhere.history(runID: run.id).map(\.kind) == [.hop, .unhop])
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
    }

    /// A step that returned here and was then ended from outside (`engine.unhop` with its
    /// token) before its held unhop was written: the run goes on from its history, with the
    /// outside unhop's output, the step not run again. The held unhop is refused either with
    /// the body's next record (`bySweep: false`) or when written alone after the hold limit,
    /// while the body awaits something else (`bySweep: true`).
    @Test(arguments: [false, true])
    func aStepEndedFromOutsideBeforeItsHeldUnhopIsWrittenGoesOnFromHistory(bySweep: Bool) async throws {
        let folder = try TemporaryDirectory()
        let sweeps = Mutex(0)
        var configuration = HopEngine.Configuration(observer: { event in
            if case .willRecord(_, .unhop, "first") = event { sweeps.withLock { $0 += 1 } }
        })
        // Held until the body's next record, or written alone half a second after the step returned.
        configuration.heldUnhopLimit = bySweep ? .milliseconds(500) : .seconds(600)
        let returned = Gate()
        let gate = Gate()
        let outputs = Mutex<[String?]>([])
        let entered = Mutex(0)
        let engine = try await Self.pairEngine(
            folder, configuration: configuration, first: { _ in entered.withLock { $0 += 1 } }
        ) { _, output in
            outputs.withLock { $0.append(output) }
            returned.open()
            await gate.wait()
        }
        let run = try await engine.start("pair")
        await returned.wait()
        let inFlight = try #require(try await engine.inFlight(flow: "pair"))
        #expect(inFlight.step == "first", "the held unhop was written before the test could race it")
        try await engine.unhop(flow: "pair", token: inFlight.token, output: "from outside")
        if bySweep {
            try await waitUntil("the held unhop is written alone") { sweeps.withLock { $0 } > 0 }
        }
        gate.open()
        try await waitUntil("the run completes") {
            try await engine.storage.run(id: run.id)?.status == .completed
        }
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
        #expect(history[1].value == #""from outside""#)
        #expect(entered.withLock { $0 } == 1, "the step ran again")
        #expect(outputs.withLock { $0 } == [nil, "from outside"], "the body went on without the history's output")
    }

    /// A step still running when it is ended from outside (`engine.unhop` with its token),
    /// which then unhops itself: its unhop is taken, and refused when written — with the
    /// body's next record, or at once by the step's `makeDurable()`, which throws the refusal.
    /// That fails neither the step nor the run, whether the step throws the refusal or returns:
    /// the run goes on from its history, with the outside unhop's output (a body that went on
    /// with the step's own output is executed again from the history).
    @Test(arguments: [(false, false), (true, false), (true, true)])
    func aRunningStepEndedFromOutsideLetsTheRunGoOnFromHistory(makesDurable: Bool, throwsIt: Bool) async throws {
        let folder = try TemporaryDirectory()
        var configuration = HopEngine.Configuration()
        configuration.heldUnhopLimit = .seconds(600)  // written with the body's next record, or by makeDurable
        let running = Gate()
        let proceed = Gate()
        let refusal = Mutex<HopError.Code?>(nil)
        let outputs = Mutex<[String?]>([])
        let engine = try await Self.pairEngine(
            folder, configuration: configuration,
            first: { context in
                running.open()
                await proceed.wait()
                try await context.unhop(output: "own")
                guard makesDurable else { return }
                do {
                    try await context.makeDurable()
                } catch let error as HopError {
                    refusal.withLock { $0 = error.code }
                    if throwsIt { throw error }
                }
            }
        ) { _, output in outputs.withLock { $0.append(output) } }
        let run = try await engine.start("pair")
        await running.wait()
        let inFlight = try #require(try await engine.inFlight(flow: "pair"))
        try await engine.unhop(flow: "pair", token: inFlight.token, output: "from outside")
        proceed.open()
        try await waitUntil("the run completes") {
            try await engine.storage.run(id: run.id)?.status == .completed
        }
        #expect(refusal.withLock { $0 } == (makesDurable ? .refused : nil))
        let history = try await engine.storage.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
        #expect(history[1].value == #""from outside""#)
        #expect(outputs.withLock { $0 } == (makesDurable ? ["from outside"] : ["own", "from outside"]))
    }

    /// Cancels the run of "pair" as an operator does: `hopctl cancel`, a process of its own.
    static func cancelWithHopctl(_ folder: TemporaryDirectory) async throws {
        let cancel = try await run("hopctl", ["cancel", "--flow", "pair", "--db", folder.database], in: folder)
        #expect(cancel.status == 0, "\(cancel.stderr)")
    }

    /// A run cancelled by another process (`hopctl cancel`) after its step returned and before
    /// its next record: that record, carrying the held unhop, is refused, and the execution stops
    /// as finished elsewhere, writing nothing more; it is not a failure of the run's.
    @Test func aRunCancelledBeforeItsHeldUnhopIsWrittenStopsAsFinishedElsewhere() async throws {
        let folder = try TemporaryDirectory()
        let tracer = InMemoryTracer()
        var configuration = HopEngine.Configuration(tracer: tracer)
        configuration.heldUnhopLimit = .seconds(600)  // held until the body's next record
        let returned = Gate()
        let gate = Gate()
        let engine = try await Self.pairEngine(
            folder, configuration: configuration,
            between: { _, _ in
                returned.open()
                await gate.wait()
            })
        let started = try await engine.start("pair")
        await returned.wait()
        try await Self.cancelWithHopctl(folder)
        gate.open()
        #expect(try await engine.settled(runID: started.id)?.status == .cancelled)
        let execution = try #require(tracer.finishedSpans.first { $0.operationName == "run pair" })
        #expect(execution.attributes.get("hop.outcome") == "finished_elsewhere")
        #expect(execution.errors.isEmpty, "\(execution.errors)")
        let history = try await engine.storage.history(runID: started.id)
        #expect(history.map(\.kind) == [.hop, .cancel], "the step's end and the next hop were not written")
    }

    /// A step that fails after another process cancelled its run (`hopctl cancel`) while it ran:
    /// the execution stops as finished elsewhere and tries to record nothing, neither the
    /// failed attempt nor the step's end.
    @Test func aStepThatFailsAfterItsRunWasCancelledElsewhereRecordsNothing() async throws {
        struct StepError: Error {}
        let folder = try TemporaryDirectory()
        let tracer = InMemoryTracer()
        let attempted = Mutex<[HistoryKind]>([])
        let configuration = HopEngine.Configuration(
            observer: { event in
                if case .willRecord(_, let kind, _) = event { attempted.withLock { $0.append(kind) } }
            }, tracer: tracer)
        let running = Gate()
        let proceed = Gate()
        let engine = try await Self.pairEngine(
            folder, configuration: configuration,
            first: { _ in
                running.open()
                await proceed.wait()
                throw StepError()
            })
        let started = try await engine.start("pair")
        await running.wait()
        try await Self.cancelWithHopctl(folder)
        proceed.open()
        #expect(try await engine.settled(runID: started.id)?.status == .cancelled)
        #expect(attempted.withLock { $0 } == [.hop], "only the hop to the step was recorded")
        let execution = try #require(tracer.finishedSpans.first { $0.operationName == "run pair" })
        #expect(execution.attributes.get("hop.outcome") == "finished_elsewhere")
        #expect(try await engine.storage.history(runID: started.id).map(\.kind) == [.hop, .cancel])
    }

    /// A step that unhops after another process cancelled its run (`hopctl cancel`) and then
    /// makes its records durable learns that its unhop was refused, as a `HopError` (not the
    /// engine's own signal to stop); the run stays cancelled, its step's end not written.
    @Test func aStepWhoseRunWasCancelledLearnsItsUnhopWasRefusedFromMakeDurable() async throws {
        let folder = try TemporaryDirectory()
        var configuration = HopEngine.Configuration()
        configuration.heldUnhopLimit = .seconds(600)  // written by makeDurable, not the sweep
        let running = Gate()
        let proceed = Gate()
        let refusal = Mutex<String?>(nil)
        let engine = try await Self.pairEngine(
            folder, configuration: configuration,
            first: { context in
                running.open()
                await proceed.wait()
                try await context.unhop(output: "own")
                do {
                    try await context.makeDurable()
                } catch let error as HopError where error.code == .refused {
                    refusal.withLock { $0 = error.description }
                    throw error
                }
            })
        let started = try await engine.start("pair")
        await running.wait()
        try await Self.cancelWithHopctl(folder)
        proceed.open()
        #expect(try await engine.settled(runID: started.id)?.status == .cancelled)
        let message = try #require(refusal.withLock { $0 }, "makeDurable did not throw a refusal")
        #expect(message.contains("finished") && message.contains("'first'"), "\(message)")
        #expect(try await engine.storage.history(runID: started.id).map(\.kind) == [.hop, .cancel])
    }

    /// A step that unhops after it returned (from a task it left behind) is refused, whether
    /// its end is still held or already written, and the step ends once.
    @Test func aStepThatUnhopsAfterItReturnedIsRefusedAndEndsOnce() async throws {
        let folder = try TemporaryDirectory()
        let returned = Gate()
        let late = Mutex<Task<HopError.Code?, Never>?>(nil)
        let gate = Gate()
        let engine = try await Self.pairEngine(
            folder,
            first: { context in
                late.withLock { $0 = Self.unhop(context, after: returned) }
            }
        ) { _, _ in
            returned.open()
            await gate.wait()
        }
        let run = try await engine.start("pair")
        await returned.wait()
        let task = try #require(late.withLock { $0 })
        #expect(await task.value == .refused)
        gate.open()
        #expect(try await engine.settled(runID: run.id)?.status == .completed)
        #expect(
            try await engine.storage.history(runID: run.id).map(\.kind) == [.hop, .unhop, .hop, .unhop, .complete])
    }
}
