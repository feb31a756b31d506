import Foundation
import HopEngine
import HopTestSupport
import Logging
import PostgresNIO
import Synchronization
import Testing

/// Recovering a diverged run: a new run takes its history up to an entry as done.
@Suite struct ForkTests {
    /// The start-up flow as version 1 was first shipped.
    static let shipped = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            try await flow.markUsed("onboarding")
        }
        try await flow.hop(to: "profile")
        if try await flow.session() == nil { try await flow.hop(to: "login") }
        try await flow.hop(to: "main")
    }

    /// Version 1 changed in place (no patch): the profile step is gone.
    static let changed = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            try await flow.markUsed("onboarding")
        }
        if try await flow.session() == nil { try await flow.hop(to: "login") }
        try await flow.hop(to: "main")
    }

    static func engine(_ storage: any HopStorage, _ flow: Flow, bodies: Bodies) -> HopEngine {
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(flow)
        for step in ["splash", "profile", "main"] {
            engine.register(step: step) { context in
                bodies.lines.withLock { $0.append("\(context.runID) \(context.step)") }
            }
        }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        return engine
    }

    @Test(arguments: TestBackend.all)
    func aDivergedRunForkedFromAnyEntryCompletesWithoutRunningAStepBeforeItAgain(backend: TestBackend) async throws {
        // The diverged run: shipped code ran it into login; changed code replays it and diverges.
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let store = try await backend.open(folder)  // hopctl's side of the database
        let bodies = Bodies()
        let shipped = Self.engine(storage, Self.shipped, bodies: bodies)
        let run = try await shipped.start("startup", subject: "kiosk-1")
        _ = try await shipped.settled(runID: run.id)
        try await shipped.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
        #expect(try await shipped.settled(runID: run.id)?.currentStep == "login")
        try await store.storeSession(subject: "kiosk-1", userID: "alice", token: "t")
        let changed = Self.engine(storage, Self.changed, bodies: bodies)
        #expect(try await changed.resumeAll() == 1)
        #expect(try await changed.settled(runID: run.id)?.status == .diverged)
        let history = try await storage.history(runID: run.id)
        // The possible entries: up to the last one the changed code agrees with.
        let message = try #require(history.last { $0.kind == .diverge }?.value)
        let disagreeing = try #require(message.firstMatch(of: /\(history entry (\d+)\)/).flatMap { Int64($0.1) })
        let last = disagreeing - 1

        var forkedFrom: [Int64] = []
        var previous = run.id
        for seq in 1...last {
            let before = bodies.lines.withLock { $0 }
            let fork: (old: RunRecord, new: RunRecord)
            do {
                fork = try await store.forkRun(
                    flow: "startup", subject: "kiosk-1", runID: run.id, through: seq, version: nil)
            } catch let error as HopError where error.code == .refused {
                // Only a cut inside a hop (its step would be in flight) is refused, and it changes nothing.
                #expect(error.reason.contains("in flight"), "entry \(seq): \(error)")
                #expect(try await storage.latestRun(flow: "startup", subject: "kiosk-1")?.id == previous)
                continue
            }
            forkedFrom.append(seq)
            previous = fork.new.id
            _ = try await changed.resumeAll()
            var state = try await changed.settled(runID: fork.new.id)
            if state?.status == .parked, state?.currentStep == "onboarding" {
                // Taken over before onboarding ended: onboarding is entered again, and finished again.
                try await changed.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
                state = try await changed.settled(runID: fork.new.id)
            }
            #expect(state?.status == .completed, "forked through entry \(seq): \(String(describing: state))")
            // No step whose unhop was taken over ran again in the new run.
            let done = history.filter { $0.seq <= seq && $0.kind == .unhop }.compactMap(\.step)
            let ranAgain = bodies.lines.withLock { $0 }.dropFirst(before.count).filter { line in
                done.contains { line == "\(fork.new.id) \($0)" }
            }
            #expect(ranAgain.isEmpty, "forked through entry \(seq), ran again: \(ranAgain)")
            let links = try await storage.history(runID: fork.new.id).first
            #expect(links?.kind == .fork && links?.value == #"{"from":\#(run.id),"through":\#(seq)}"#)
        }
        #expect(forkedFrom.count >= last / 2, "forked from \(forkedFrom) of 1…\(last)")
        let old = try await storage.history(runID: run.id).filter { $0.kind == .fork }
        #expect(old.count == forkedFrom.count, "every fork is linked from the old run")
    }

    /// A fork through the entry of a durable timer takes the timer's deadline as it was recorded
    /// (a file keeps it by the uptime clock of its boot, and the fork copies it as it is kept):
    /// the new run reads the same deadline, kept the same way, as the old run does.
    @Test(arguments: TestBackend.all)
    func aForkThroughADurableTimerKeepsItsDeadline(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let napping = Flow("nap", version: "1") { flow in
            try await flow.hop(to: "splash")
            try await flow.sleep(for: .seconds(3600), name: "nap")
            try await flow.hop(to: "main")
        }
        let engine = Self.engine(storage, napping, bodies: Bodies())
        let run = try await engine.start("nap", subject: "kiosk-1")
        try await waitUntil("the run sleeps") {
            try await storage.history(runID: run.id).contains { $0.kind == .timer }
        }
        _ = try await engine.cancel(flow: "nap", subject: "kiosk-1")
        #expect(try await engine.settled(runID: run.id)?.status == .cancelled)
        let history = try await storage.history(runID: run.id)
        let timer = try #require(history.last { $0.kind == .timer })
        let deadline = try #require(timer.deadline)
        #expect(deadline.timeIntervalSinceNow > 3000, "\(deadline)")

        let fork = try await storage.forkRun(
            flow: "nap", subject: "kiosk-1", runID: run.id, through: timer.seq, version: nil)
        let taken = Array(try await storage.history(runID: fork.new.id).dropFirst())
        let expected = history.filter { $0.seq <= timer.seq && $0.kind.isReplayed }
        #expect(taken.map(\.kind) == expected.map(\.kind))
        #expect(taken.map(\.value) == expected.map(\.value))
        #expect(taken.map(\.seq) == Array(2...Int64(expected.count + 1)))
        #expect(taken.last?.deadline == deadline)
        #expect(taken.last?.deadlineGoesByTheWallClock == timer.deadlineGoesByTheWallClock)
    }

    /// A fork of a long run on PostgreSQL writes the entries it takes without updating the new
    /// run's row for each: a row updated N times in one transaction leaves N versions, which each
    /// later update and lookup of the row walks, so a fork of 20,000 entries took 18 s there (0.1 s
    /// on a file), and of 200,000 more than ten minutes, holding the old run's row all along. The
    /// server's own count of the row updates (flushed once the fork's connection is idle) says
    /// how many there were; the new run's history says they were all written, in order.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aForkOfALongRunOnPostgreSQLUpdatesTheNewRunsRowOnce() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let store = try await TestBackend.postgres.open(folder)
        let laps = 2000
        let at = Date(timeIntervalSince1970: 1_700_000_000)
        try await store.restore(
            HopSnapshot(
                runs: [
                    RunRecord(
                        id: 1, flow: "loop", subject: "s", flowVersion: "1", status: .running, currentStep: "tick")
                ],
                history: (1...Int64(2 * laps + 1)).map { seq in
                    .recorded(
                        runID: 1, seq: seq, kind: seq % 2 == 1 ? .hop : .unhop, step: "tick", token: "t\(seq / 2)",
                        value: seq % 4 == 2 ? #"{"lap":\#(seq / 4)}"# : nil, at: at)
                },
                firstUse: [], sessions: [], facts: []))
        let statistics = try await PostgresConnectionLossTests.connect(url)
        // Closed whatever happens: PostgresNIO asserts that each connection is closed.
        defer { Task { try? await statistics.close() } }
        /// Rows inserted into `history` and updates of `runs` rows, as the server has counted them so far.
        func counted() async throws -> (inserted: Int64, updated: Int64) {
            let rows = try await statistics.query(
                """
                SELECT (SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'history'),
                       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'runs')
                """, logger: PostgresConnectionLossTests.quiet
            ).collect()
            let cells = try #require(rows.first).makeRandomAccess()
            return (try cells[0].decode(Int64?.self) ?? 0, try cells[1].decode(Int64?.self) ?? 0)
        }
        try await HopStoreTestSupport.waitUntil("the restore's inserts are counted", timeout: .seconds(60)) {
            try await counted().inserted >= Int64(2 * laps + 1)
        }
        let before = try await counted()
        let through = Int64(2 * laps)  // the last unhop: no step in flight
        let fork = try await store.forkRun(flow: "loop", subject: "s", runID: 1, through: through, version: nil)
        // The new run's link, the 4,000 entries taken, the old run's link.
        let inserted = Int64(2 * laps + 2)
        try await HopStoreTestSupport.waitUntil("the fork's inserts are counted", timeout: .seconds(60)) {
            try await counted().inserted >= before.inserted + inserted
        }
        let updates = try await counted().updated - before.updated
        #expect(updates <= 5, "the fork updated runs' rows \(updates) times for \(inserted) entries")
        let history = try await store.history(runID: fork.new.id)
        #expect(history.map(\.seq) == Array(1...(through + 1)))
        let taken = try await store.history(runID: 1).filter { $0.seq <= through }
        #expect(history.dropFirst().map(\.kind) == taken.map(\.kind))
        #expect(history.dropFirst().map(\.token) == taken.map(\.token))
        #expect(history.dropFirst().map(\.value) == taken.map(\.value))
    }
}

/// The step bodies that ran, as "run step" lines.
final class Bodies: Sendable {
    let lines = Mutex<[String]>([])
}
