import Foundation
import HopEngine
import Logging
import ServiceLifecycle
import Synchronization

/// Starts (or resumes) the start-up flow, narrates it, and ends once the run is over, so
/// that the service group shuts the engine down with it. With `auto`, it finishes the
/// external steps itself after a short pause.
///
/// It follows its run wherever it is executed: another daemon on the same database may execute
/// it, and `hopctl` may cancel, restart or finish it; a restart is followed to the new run.
///
/// While the database fails in a way that may pass (a busy file, a PostgreSQL server away or
/// refusing), it says so once and waits: its looks at the run are tried again at the next
/// tick, and what it needs to begin, every second. It never ends on such a failure: the engine
/// goes on with the run once the database answers again.
struct DemoService: Service {
    /// What the service reacts to: the engine's events, and a regular look at the stored run.
    enum Event: Sendable {
        case engine(EngineEvent)
        case tick
        /// The run ended: queued behind every event this process's engine sent about it.
        case end
    }

    let engine: HopEngine
    /// The database the engine executes on, for what the demo reads.
    let store: HopDatabase
    let events: AsyncStream<Event>
    let ticks: AsyncStream<Event>.Continuation
    let narrator: Narrator
    let subject: String
    let auto: Bool
    /// How the run ended, once it has.
    let outcome: Outcome

    func run() async throws {
        do {
            // Cancelled as the group shuts down: that ends its loop over the events, and a look at
            // the run that waits for a database that does not answer (a PostgreSQL server away,
            // for a minute), which must not hold the stop.
            try await cancelWhenGracefulShutdown { try await self.follow() }
        } catch is CancellationError {
            // Shut down while it waited for the database to begin: the run stays resumable.
        }
    }

    private func follow() async throws {
        let existing = try await retrying { try await store.latestRun(flow: "startup", subject: subject) }
        var past: Int64 = 0
        if let existing, existing.status.isUnfinished {
            past = try await retrying { try await store.history(runID: existing.id, limit: 1).last?.seq ?? 0 }
            let at = existing.currentStep.map { "at \($0)" } ?? "from its last step"
            narrator.say("resuming run \(existing.id) of startup for \(subject) \(at)")
        }
        var run = try await retrying { try await engine.start("startup", subject: subject) }
        if existing?.id != run.id { narrator.say("run \(run.id) of startup for \(subject): started") }
        var parkedStep: String?
        // The step this engine last hopped the run to, for the last word on shutdown.
        var lastHop: String?
        // The last history entry of the run told: a resumed run's past is not told again.
        var narrated = existing?.id == run.id ? past : 0
        var ending = false
        // Whether this process's engine executes the run: then its events tell what happens.
        // Otherwise another daemon executes it, or none does and hopctl steers it, and the ticks
        // tell what the run's row says changed (`updatedAt`), read from its history.
        var executingHere = false
        var seen = run.updatedAt
        /// Tells a history entry of the run, and after the end of the step the run was parked
        /// on (whoever recorded it) that the run continues.
        func tell(_ entry: HistoryEntry) {
            narrator.recorded(entry, subject: subject)
            narrated = entry.seq
            if entry.kind == .hop { lastHop = entry.step }
            if [.unhop, .timeout, .reroute].contains(entry.kind), let step = parkedStep, entry.step == step {
                narrator.say("\(step) finished: run \(run.id) continues")
                parkedStep = nil
            }
        }
        /// Tells the entries of the run's history not told yet: what another process recorded.
        func tellRecordedElsewhere() async throws {
            for entry in try await store.history(runID: run.id) where entry.seq > narrated { tell(entry) }
        }
        // The parking last told, by its hop's token: the engine's event and a tick may both come
        // for one parking, in either order, and the event after its step has ended (it was queued).
        var toldParking: String?
        /// Tells that the run, as `record` says, is parked, once per parking, with what ends it.
        func parking(_ record: RunRecord) async throws {
            guard record.status == .parked, let step = record.currentStep else { return }
            let parking = record.currentToken ?? step
            guard parking != toldParking else { return }
            toldParking = parking
            parkedStep = step
            try await parked(on: step)
        }
        try await parking(run)
        // The run may be changed by other processes, which send this one no event. One tick
        // waits at a time: a look slower than the ticks (a database that makes each one wait,
        // then fails it) must not queue more, or what the engine says would wait behind them.
        let tickWaits = Atomic<Bool>(false)
        let ticker = Task { [ticks] in
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(100))
                if !tickWaits.exchange(true, ordering: .relaxed) { ticks.yield(.tick) }
            }
        }
        defer { ticker.cancel() }

        for await event in events {
            if case .tick = event { tickWaits.store(false, ordering: .relaxed) }
            do {
                switch event {
                case .engine(.databaseFailing(let error)):
                    narrator.say("the database fails (\(error.code)): the run waits until it answers")
                case .engine(.databaseAnswers):
                    narrator.say("the database answers again")
                case .engine(.recorded(let reference, let entry)) where reference.id == run.id && entry.seq > narrated:
                    tell(entry)
                case .engine(.settled(let record)) where record.id == run.id && record.status == .parked:
                    executingHere = false
                    seen = record.updatedAt  // told as it happened: no tick need read it
                    try await parking(record)
                case .engine(.executing(let reference, _)) where reference.id == run.id:
                    executingHere = true
                    // What ended the parking, when another process recorded it (an operator's
                    // unhop, a stored session), whether or not a tick told it first.
                    try await tellRecordedElsewhere()
                    if let step = parkedStep {  // ended by no entry told: not expected, said all the same
                        narrator.say("\(step) finished: run \(run.id) continues")
                        parkedStep = nil
                    }
                case .engine(.settled), .tick:
                    // Settled here, or changed elsewhere: a restart is followed, an end is reported.
                    if case .engine(.settled(let record)) = event, record.id == run.id { executingHere = false }
                    guard let latest = try await store.latestRun(flow: "startup", subject: subject) else { continue }
                    if latest.id != run.id {
                        narrator.say("run \(run.id) was restarted by another process as run \(latest.id): following it")
                        run = latest
                        parkedStep = nil
                        narrated = 0
                        ending = false
                        executingHere = false
                        seen = latest.updatedAt
                        // What the new run recorded before this look: its events went by while this
                        // service followed the old run.
                        try await tellRecordedElsewhere()
                        if let current = try await store.run(id: run.id) { try await parking(current) }
                        continue
                    }
                    if latest.status.isUnfinished && !executingHere && latest.updatedAt != seen {
                        // Moved on elsewhere: told as it is stored, a parking with what finishes it.
                        seen = latest.updatedAt
                        try await tellRecordedElsewhere()
                        try await parking(latest)
                    }
                    if !latest.status.isUnfinished && !ending {
                        // Once this engine has settled the run, its events are all queued: tell them first.
                        _ = try await engine.settled(runID: run.id)
                        ending = true
                        ticks.yield(.end)
                    }
                case .end:
                    guard let latest = try await store.run(id: run.id) else { continue }
                    // What another process recorded (this one's entries were told as they came).
                    try await tellRecordedElsewhere()
                    outcome.status.withLock { $0 = latest.status }
                    try await summary(latest)
                    return
                default: continue
                }
            } catch let error as HopError where error.mayPass {
                // Looked at again at the next tick; the engine said the database fails.
                if case .end = event { ending = false }  // the next tick sees the end again
            }
        }
        // The engine stopped by itself: where the run is, this service cannot know.
        if let failure = outcome.engineFailure.withLock({ $0 }) {
            return narrator.say("stopping: the engine stopped (\(failure.code)); the error says why")
        }
        // Shut down: the run as stored if it can be read (not on PostgreSQL, whose client refuses a
        // query of this cancelled task), else where this service last saw it.
        let record = try? await store.run(id: run.id)
        if record?.status.isUnfinished ?? true {
            let step = record.map(\.currentStep) ?? (parkedStep ?? lastHop)
            narrator.say("stopping; run \(run.id) stays resumable\(step.map { " at \($0)" } ?? "")")
        }
    }

    private func parked(on step: String) async throws {
        narrator.say("parked at \(step)")
        guard auto else { return narrator.waiting(on: step, subject: subject) }
        narrator.note("--auto: finishing \(step) in a moment")
        try await Task.sleep(for: .seconds(1))
        do {
            try await retrying {
                if step == "login" {
                    guard try await store.session(subject: subject) == nil else { return }
                    try await engine.storeSession(
                        subject: subject, userID: "alice", token: Token.random(byteCount: 32))
                } else {
                    try await engine.unhop(flow: "startup", subject: subject, step: step, output: ["accepted": true])
                }
            }
        } catch let error as HopError where error.code == .refused || error.code == .notFound {
            narrator.note("--auto: \(step) was finished by another process")  // a second daemon on this database
        }
    }

    /// `body`, tried again every second while the database fails in a way that may pass (said
    /// once); throws `CancellationError` when the service is shut down meanwhile (``run()``
    /// cancels it then).
    private func retrying<Value: Sendable>(_ body: () async throws -> Value) async throws -> Value {
        var said = false
        while true {
            do {
                return try await body()
            } catch let error as HopError where error.mayPass {
                if !said {
                    narrator.note("cannot read or write the database (\(error.code)); trying again every second")
                    said = true
                }
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    private func summary(_ run: RunRecord) async throws {
        narrator.say("run \(run.id) is \(run.status.rawValue)")
        let flags = try await store.firstUseFlags(subject: subject).map(\.feature)
        let session = try await store.session(subject: subject)
        let runs = try await store.allRuns(flow: "startup").filter { $0.subject == subject }
        narrator.note(
            "stored state for \(subject): used \(flags.isEmpty ? "nothing yet" : flags.joined(separator: ", ")); "
                + "session \(session.map { "of \($0.userID) (token \(StoredSession.redact($0.token)))" } ?? "none"); "
                + "\(runs.count) run\(runs.count == 1 ? "" : "s") of startup")
    }
}

/// How the demo's run ended, for the exit status.
final class Outcome: Sendable {
    let status = Mutex<RunStatus?>(nil)
    /// Why the engine stopped by itself, if it did (its database file was replaced, say).
    let engineFailure = Mutex<HopError?>(nil)
}

/// The engine as a service of the group, noting why it stopped by itself in ``Outcome``: the
/// demo then does not say where the run stays, which it cannot know.
struct EngineService: Service {
    let engine: HopEngine
    let outcome: Outcome

    func run() async throws {
        do {
            try await engine.run()
        } catch let error as HopError {
            outcome.engineFailure.withLock { $0 = error }
            throw error
        }
    }
}
