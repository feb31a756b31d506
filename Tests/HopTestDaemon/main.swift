import Foundation
import HopEngine
import HopPostgres
import HopStore
import Logging
import Synchronization

// Test helper: a daemon process running the startup flow on a real database, for the tests
// that kill, restart and steer it from outside.
//
// Usage: hop-test-daemon --db PATH|postgres://URL [--files PREFIX] [--external] [--version V] [--subject S]
//   --files PREFIX  where PREFIX.bodies and PREFIX.release live (default: the database's path;
//                required in effect with a postgres:// database)
//   --external   onboarding and login are external steps (login is unhopped by storing a session),
//                and the engine runs as a service until the run completes;
//                otherwise every step runs in process and the daemon exits once the run settles.
//   --version 2  the flow code of a later release: main follows splash directly.
//   --versions 1,2  registers these versions of the flow side by side (the last is the newest, on
//                which a new run starts); replaces --version
//   --wait-all   (with --external) exits only once no run in the database is unfinished (either backend)
//   --patch      version 1's code with a patch: a terms step (in process) after onboarding, behind
//                flow.patched("terms-screen")
//   --code 2     registers version 2's code under the version name(s) given: flow code changed
//                without a new version, which diverges from the runs it recorded
//   --engine-id  the engine's label ("hop-test-daemon" by default); ownership goes by incarnation, not by it
//   --lease S    the lease duration in seconds (10 by default)
//   --sleep S    the flow sleeps durably for S seconds after splash
//   --reroute    main is external and ended by a logout, after which the flow goes back through login
//                (with --external)
//   --subjects N runs the flow for subjects user-0 … user-(N-1) (with --external), prints "started N"
//                once every run is parked, and serves until its standard input closes
//   --mixed N    runs the flow "mixed" for subjects mixed-0 … mixed-(N-1), a third of them each in a
//                step that works until the file PATH.release exists, in a durable sleep of 10 s, and
//                parked on an external step with a 10 s timeout (HOP_TEST_MIXED_WAIT sets both: a test
//                that must start many runs before the first is due, on a loaded machine, sets more);
//                prints "started N" once every run is there, and serves until standard input closes
//   --fleet      one engine of a fleet: every step in process, each working 50-300 ms; runs
//                whatever runs it can claim (started elsewhere) and serves until standard input
//                closes. Each body line in PREFIX.bodies also names the process: "<run> <step> <pid>"
//   --graceful   (with --external) SIGTERM stops the engine as a daemon's service group does (its
//                executions stopped, its records durable), then the process prints "stopped" and exits 0
//   --retention S prunes runs that finished more than S seconds ago, keeping each subject's newest,
//                every 100 ms (Configuration.retention)
//   --stop-on-lapse  stops executing a run whose lease it could not renew in time
//                (Configuration.lapsedLeases = .stopExecuting)
//   --busy-timeout S  (a file) how long a write waits for the write lock another process holds
//                (HopStore.Options.busyTimeout, 5 s by default)
// Environment:
//   HOP_TEST_KILL_AT=<point>   SIGKILL this process at the point, e.g. "before:hop:splash", "after:unhop:login"
//   HOP_TEST_STOP_AT=<point>   SIGSTOP this process the first time it reaches the point (the test sends SIGCONT)
//   HOP_TEST_FAILS=<n>         splash throws on its first n attempts (it is tried up to 3 times)
//   HOP_TEST_SLOW_SPLASH=1     splash runs until its task is cancelled (then it notes "<run> splash-cancelled")
//   HOP_TEST_SPLASH_RUNS_ON=1  splash unhops (output {"cache":"held"}; it notes "<run> splash-unhopped"), then
//                              runs on until standard input closes (it notes "<run> splash-returned" and
//                              returns) or its task is cancelled (it notes "<run> splash-ran-on"); the engine
//                              holds a step's unhop for up to 600 s instead of milliseconds, so that the unhop
//                              is still held whenever the test freezes the process
//   HOP_TEST_SPLASH_WAITS=1    splash waits until standard input closes, then goes on as usual
//   HOP_TEST_WORK_TIMEOUT=<s>  (with --mixed) the step "work" times out after s seconds
//   HOP_TEST_MIXED_WAIT=<s>    (with --mixed) the durable sleep and the external step's timeout last s
//                              seconds instead of 10
//   HOP_TEST_PAUSE_BEFORE_END=1  after main the flow body sleeps 600 s before it returns, recording nothing
// Prints "point <point>" for every point, "parked <step>" and "settled <status>".
// Each step body appends "<run id> <step>\n" to PATH.bodies, so tests can count how often bodies ran.

struct Options {
    var path = ""
    var files: String?
    var external = false
    var version = "1"
    var subject = "default"
    var engineID = "hop-test-daemon"
    var lease = 10.0
    var sleep = 0.0
    var reroute = false
    var subjects = 0
    var mixed = 0
    var versions: [String] = []
    var waitAll = false
    var code: String?
    var patch = false
    var retention: Double?
    var stopOnLapse = false
    var busyTimeout: Double?
    var fleet = false
    var graceful = false
    var flow = "startup"

    static func parse() -> Options {
        var options = Options()
        var arguments = ArraySlice(CommandLine.arguments.dropFirst())
        while let argument = arguments.popFirst() {
            switch argument {
            case "--db": options.path = arguments.popFirst() ?? ""
            case "--files": options.files = arguments.popFirst()
            case "--external": options.external = true
            case "--version": options.version = arguments.popFirst() ?? "1"
            case "--subject": options.subject = arguments.popFirst() ?? "default"
            case "--engine-id": options.engineID = arguments.popFirst() ?? options.engineID
            case "--lease": options.lease = Double(arguments.popFirst() ?? "") ?? options.lease
            case "--sleep": options.sleep = Double(arguments.popFirst() ?? "") ?? 0
            case "--reroute": options.reroute = true
            case "--subjects": options.subjects = Int(arguments.popFirst() ?? "") ?? 0
            case "--mixed": options.mixed = Int(arguments.popFirst() ?? "") ?? 0
            case "--versions": options.versions = (arguments.popFirst() ?? "").split(separator: ",").map(String.init)
            case "--wait-all": options.waitAll = true
            case "--code": options.code = arguments.popFirst()
            case "--patch": options.patch = true
            case "--fleet": options.fleet = true
            case "--graceful": options.graceful = true
            case "--flow": options.flow = arguments.popFirst() ?? "startup"
            case "--retention": options.retention = Double(arguments.popFirst() ?? "")
            case "--stop-on-lapse": options.stopOnLapse = true
            case "--busy-timeout": options.busyTimeout = Double(arguments.popFirst() ?? "")
            default:
                FileHandle.standardError.write(Data("unknown argument \(argument)\n".utf8))
                exit(64)
            }
        }
        return options
    }
}

/// The start-up flow of `version`: version 1 is the product's; any other is a later release's, in
/// which main follows splash directly. With `--code`, that version's code, whatever `version` says.
func startupFlow(version: String) -> Flow {
    let code = options.code ?? version
    return Flow("startup", version: version) { flow in
        try await flow.hop(to: "splash")
        if options.sleep > 0 { try await flow.sleep(for: .milliseconds(Int64(options.sleep * 1000))) }
        guard code == "1" else {
            try await flow.hop(to: "main")
            return
        }
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            if options.patch, try await flow.patched("terms-screen") { try await flow.hop(to: "terms") }
            try await flow.markUsed("onboarding")
        }
        while true {
            if try await flow.session() == nil {
                try await flow.hop(to: "login")
            }
            if try await !flow.hop(to: "main").rerouted { break }
        }
        // Awaits something that is not Hop's (no record): the end of main (which returns
        // without unhopping) must not wait for it.
        if pauseBeforeEnd { try await Task.sleep(for: .seconds(600)) }
    }
}

/// A fleet engine's step works a while, so that a kill lands inside steps as well as between them.
func fleetWork() async throws {
    guard options.fleet else { return }
    try await Task.sleep(for: .milliseconds(Int.random(in: 50...300)))
}

/// Writes a line to standard output at once: a SIGKILL must not lose it in a buffer.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

let options = Options.parse()
let path = options.path
let external = options.external
let version = options.version
let subject = options.subject
let environment = ProcessInfo.processInfo.environment
let killAt = environment["HOP_TEST_KILL_AT"]
let stopAt = environment["HOP_TEST_STOP_AT"]
let stoppedAtPoint = Atomic(false)
let failures = Int(environment["HOP_TEST_FAILS"] ?? "") ?? 0
let slowSplash = environment["HOP_TEST_SLOW_SPLASH"] == "1"
let splashRunsOn = environment["HOP_TEST_SPLASH_RUNS_ON"] == "1"
let splashWaits = environment["HOP_TEST_SPLASH_WAITS"] == "1"
let inputEnd = InputEnd()
let pauseBeforeEnd = environment["HOP_TEST_PAUSE_BEFORE_END"] == "1"
// A database on a server has no folder: --files names the prefix of the test's files then.
let files = options.files ?? path
let bodies = files + ".bodies"

func noteBody(_ context: StepContext, _ what: String? = nil) {
    let step = "\(context.runID) \(what ?? context.step)\(options.fleet ? " \(getpid())" : "")"
    let descriptor = open(bodies, O_WRONLY | O_CREAT | O_APPEND, 0o600)
    guard descriptor >= 0 else { return }
    _ = "\(step)\n".withCString { write(descriptor, $0, strlen($0)) }
    close(descriptor)
}

func point(_ name: String) {
    say("point \(name)")
    if name == killAt { kill(getpid(), SIGKILL) }
    if name == stopAt, !stoppedAtPoint.exchange(true, ordering: .relaxed) { kill(getpid(), SIGSTOP) }
}

let observer: @Sendable (EngineEvent) -> Void = { event in
    switch event {
    case .willRecord(_, let kind, let step): point("before:\(kind.rawValue):\(step ?? "-")")
    case .recorded(_, let entry): point("after:\(entry.kind.rawValue):\(entry.step ?? "-")")
    case .settled(let run):
        if run.status == .parked { say("parked \(run.currentStep ?? "?")") }
    case .executing(let run, let replaying): say("executing run \(run.id) replaying \(replaying)")
    case .ready: say("ready")
    case .databaseFailing(let error): say("database failing \(error.code)")
    case .databaseAnswers: say("database answers")
    }
}

var logger = Logger(label: "hop-test-daemon")
logger.logLevel = .error
do {
    let database =
        if let busyTimeout = options.busyTimeout {
            try await HopStore.open(
                path: path, options: HopStore.Options(busyTimeout: .milliseconds(Int64(busyTimeout * 1000)))
            ).database
        } else {
            try await HopDatabase.open(path)
        }
    let store = database.storage
    var configuration = HopEngine.Configuration(
        pollInterval: .milliseconds(20), leaseDuration: .milliseconds(Int64(options.lease * 1000)),
        observer: observer,
        engineID: options.engineID,
        retention: options.retention.map {
            HopEngine.Retention(finishedAfter: .milliseconds(Int64($0 * 1000)), interval: .milliseconds(100))
        })
    if splashRunsOn { configuration.heldUnhopLimit = .seconds(600) }
    if options.stopOnLapse { configuration.lapsedLeases = .stopExecuting }
    let engine = HopEngine(database: database, logger: logger, configuration: configuration)
    for version in options.versions.isEmpty ? [version] : options.versions {
        engine.register(startupFlow(version: version))
    }
    let attempts = AttemptCounter()
    engine.register(step: "splash", retry: RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(10))) { step in
        noteBody(step)
        if slowSplash {
            do {
                try await Task.sleep(for: .seconds(600))
            } catch {
                noteBody(step, "splash-cancelled")
                throw error
            }
        }
        if splashRunsOn {
            try await step.unhop(output: ["cache": "held"])
            noteBody(step, "splash-unhopped")
            do {
                try await inputEnd.wait()
            } catch {
                noteBody(step, "splash-ran-on")
                throw error
            }
            noteBody(step, "splash-returned")
            return
        }
        if splashWaits { try await inputEnd.wait() }
        if await attempts.next() <= failures { throw SplashError(attempt: step.attempt) }
        try await fleetWork()
        try await step.unhop(output: ["cache": "warm"])
    }
    if external {
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
    } else {
        engine.register(step: "onboarding") { step in
            noteBody(step)
            try await fleetWork()
            try await step.unhop(output: ["accepted": true])
        }
        engine.register(step: "login") { step in
            noteBody(step)
            try await fleetWork()
            try await step.storeSession(userID: "alice", token: "token-of-alice")
            try await step.unhop(output: ["userID": "alice"])
        }
    }
    engine.register(step: "terms") { step in noteBody(step) }
    if options.reroute {
        engine.register(step: "main", .external(unhopWhen: .sessionRemoved))
    } else {
        engine.register(step: "main") { step in
            noteBody(step)
            try await fleetWork()
        }
    }

    let workTimeout = ProcessInfo.processInfo.environment["HOP_TEST_WORK_TIMEOUT"].flatMap(Int.init).map {
        Duration.seconds($0)
    }
    let mixedWait = ProcessInfo.processInfo.environment["HOP_TEST_MIXED_WAIT"].flatMap(Int.init).map {
        Duration.seconds($0)
    }
    engine.register(
        Flow("mixed", version: "1") { flow in
            switch flow.subject.split(separator: "-").last.flatMap({ Int($0) }).map({ $0 % 3 }) {
            case 0: try await flow.hop(to: "work", timeout: workTimeout)
            case 1:
                say("napping")
                try await flow.sleep(for: mixedWait ?? .seconds(10), name: "nap")
            default: try await flow.hop(to: "wait", timeout: mixedWait ?? .seconds(10))
            }
            try await flow.hop(to: "done")
        })
    engine.register(step: "work") { step in
        noteBody(step)
        while !FileManager.default.fileExists(atPath: files + ".release") {
            try await Task.sleep(for: .milliseconds(20))
        }
    }
    engine.register(step: "wait", .external)
    // Two approvals, one after the other, of the same step: a retried `hopctl unhop` of the
    // first must not finish the second.
    engine.register(
        Flow("review", version: "1") { flow in
            try await flow.hop(to: "approve")
            try await flow.hop(to: "approve")
            try await flow.hop(to: "publish")
        })
    engine.register(step: "approve", .external)
    engine.register(step: "publish") { step in noteBody(step) }
    engine.register(step: "done") { step in noteBody(step) }

    if options.fleet {
        let service = Task { try await engine.run() }
        await waitForInputToClose()
        service.cancel()
        _ = try? await service.value
        say("stopped")
        exit(0)
    }
    let run: RunRecord
    if options.mixed > 0 {
        // Every run is in its step, its sleep or parked, unless it has moved past that already.
        let subjects: [String] = (0..<options.mixed).map { "mixed-\($0)" }
        try await serve(engine, flow: "mixed", subjects: subjects) { runIDs in
            for runID in runIDs {
                let history: [HistoryEntry] = try await store.history(runID: runID)
                if !history.contains(where: { $0.kind == .hop || $0.kind == .timer }) { return false }
            }
            return true
        }
    }
    if options.subjects > 0 {
        let subjects: [String] = (0..<options.subjects).map { "user-\($0)" }
        try await serve(engine, flow: "startup", subjects: subjects) { runIDs in
            let statuses = try await store.statuses(of: runIDs)
            return statuses.values.allSatisfy { $0.status == .parked }
        }
    }
    if external {
        let service = Task { try await engine.run() }
        let termination = options.graceful ? stopOnTermination(service) : nil
        defer { termination?.cancel() }
        run = try await engine.start(options.flow, subject: subject)
        var current = run
        func othersUnfinished() async throws -> Bool {
            guard options.waitAll else { return false }
            let runs = try await store.runs(flow: nil, subject: nil, limit: 100_000)
            return runs.contains { $0.status.isUnfinished }
        }
        while current.status.isUnfinished {
            try await Task.sleep(for: .milliseconds(10))
            current = try await store.run(id: run.id) ?? current
        }
        while try await othersUnfinished() {
            try await Task.sleep(for: .milliseconds(10))
        }
        service.cancel()
        _ = try? await service.value
        say("settled \(current.status.rawValue)")
    } else {
        run = try await engine.start("startup", subject: subject)
        let settled = try await engine.settled(runID: run.id)
        say("settled \(settled?.status.rawValue ?? "missing")")
    }
} catch {
    FileHandle.standardError.write(Data("hop-test-daemon: \(error)\n".utf8))
    exit(1)
}

struct UsageError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

struct SplashError: Error, CustomStringConvertible {
    let attempt: Int
    var description: String { "splash could not load its cache (attempt \(attempt))" }
}

actor AttemptCounter {
    var count = 0
    func next() -> Int {
        count += 1
        return count
    }
}

/// The end of standard input, for whatever waits for it (steps, the serving modes): read on a
/// thread of its own, started by the first wait, which resumes every waiter the moment the input
/// closes (no polling: a step of a process thawed after its input closed goes on at once).
final class InputEnd: Sendable {
    private struct State {
        var reading = false
        var closed = false
        var next = 0
        var waiters: [Int: CheckedContinuation<Void, any Error>] = [:]
    }
    private let state = Mutex(State())

    private func startReading() {
        let start = state.withLock { state in
            defer { state.reading = true }
            return !state.reading
        }
        guard start else { return }
        Thread.detachNewThread {
            _ = FileHandle.standardInput.readDataToEndOfFile()
            let waiters = self.state.withLock { state in
                state.closed = true
                defer { state.waiters = [:] }
                return Array(state.waiters.values)
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Returns once standard input has closed; throws `CancellationError` when cancelled first.
    func wait() async throws {
        startReading()
        let id = state.withLock { state in
            state.next += 1
            return state.next
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (waiter: CheckedContinuation<Void, any Error>) in
                let closed: Bool? = state.withLock { state in
                    if state.closed { return true }
                    if Task.isCancelled { return false }
                    state.waiters[id] = waiter
                    return nil
                }
                switch closed {
                case true?: waiter.resume()
                case false?: waiter.resume(throwing: CancellationError())
                case nil: break
                }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume(throwing: CancellationError())
        }
    }
}

/// Stops `service` (the engine's `run()`) on SIGTERM, waits until it has stopped, prints
/// "stopped" and exits 0. Returns the signal's source, which must live as long as the wait.
func stopOnTermination(_ service: Task<Void, any Error>) -> any DispatchSourceSignal {
    signal(SIGTERM, SIG_IGN)
    let source = DispatchSource.makeSignalSource(signal: SIGTERM, queue: .global())
    source.setEventHandler {
        Task {
            service.cancel()
            _ = try? await service.value
            say("stopped")
            exit(0)
        }
    }
    source.resume()
    return source
}

/// Serves until standard input closes (``InputEnd``: read on a thread of its own, off the cooperative pool).
func waitForInputToClose() async {
    try? await inputEnd.wait()
}

/// Runs the engine as a service, starts `flow` for each of `subjects`, prints "started N" once
/// `ready` holds for their runs, and serves until standard input closes; then exits.
func serve(
    _ engine: HopEngine, flow: String, subjects: [String], until ready: ([Int64]) async throws -> Bool
) async throws -> Never {
    let service = Task { try await engine.run() }
    var runIDs: [Int64] = []
    for subject in subjects { runIDs.append(try await engine.start(flow, subject: subject).id) }
    while try await !ready(runIDs) { try await Task.sleep(for: .milliseconds(10)) }
    say("started \(subjects.count)")
    await waitForInputToClose()
    service.cancel()
    _ = try? await service.value
    say("stopped")
    exit(0)
}
