import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging
import Synchronization

// Test helper: daemon code that blocks its thread beside another run, in a process of its own
// (WhereCodeRunsTests). Blocking one of the two threads of the test process's cooperative pool
// left every other test of the suite one thread for as long as the case lasted, and their
// engines' polls came tens of seconds late.
//
// Usage: hop-test-blocking --db PATH --blocking step|decision|transition|caller [--crowded]
//   --blocking  which of the daemon's code blocks its thread: a step, a `decide` read, a transition
//               hook, or the code that called `engine.start` once the start returned
//   --crowded   8 runs wait in a step first, so that flow bodies run on the pool, not the store's thread
// Prints "blocking" once the code blocks, then "quick completed while blocked" (or "quick
// completed after the blocking code returned"), then "blocking run completed"; exits 0 once
// both runs completed, 1 with a message on standard error otherwise.

/// Code of the daemon's that blocks its thread, as synchronous I/O would.
final class Blocker: Sendable {
    let entered = Atomic<Bool>(false)
    let released = Atomic<Bool>(false)
    let returned = Atomic<Bool>(false)

    /// Blocks the calling thread until released (2 minutes at most: only a failing case waits
    /// this out).
    func block() {
        entered.store(true, ordering: .relaxed)
        let deadline = ContinuousClock.now.advanced(by: .seconds(120))
        while !released.load(ordering: .relaxed) && ContinuousClock.now < deadline { usleep(1_000) }
        returned.store(true, ordering: .relaxed)
    }
}

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func main() async throws {
    var path: String?
    var which = ""
    var crowded = false
    var arguments = ArraySlice(CommandLine.arguments.dropFirst())
    while let argument = arguments.popFirst() {
        switch argument {
        case "--db": path = arguments.popFirst()
        case "--blocking": which = arguments.popFirst() ?? ""
        case "--crowded": crowded = true
        default: throw TestFailure("unknown argument \(argument)")
        }
    }
    let blocking = which
    guard let path, ["step", "decision", "transition", "caller"].contains(blocking) else {
        throw TestFailure("usage: hop-test-blocking --db PATH --blocking step|decision|transition|caller")
    }
    let engine = HopEngine(
        storage: try await HopStore.open(path: path),
        logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
    let blocker = Blocker()
    defer { blocker.released.store(true, ordering: .relaxed) }
    let crowd = Gate()
    defer { crowd.open() }
    if crowded {
        engine.register(Flow("crowd", version: "1") { flow in try await flow.hop(to: "wait") })
        engine.register(step: "wait") { _ in await crowd.wait() }
        for index in 0..<HopEngine.bodiesBesideTheStoreBelow {
            _ = try await engine.start("crowd", subject: "crowd-\(index)")
        }
    }
    engine.register(
        Flow(
            "blocking", version: "1",
            transition: { _ in
                if blocking == "transition" { blocker.block() }
            }
        ) { flow in
            _ = try await flow.decide("slow") { () -> Bool in
                if blocking == "decision" { blocker.block() }
                return true
            }
            try await flow.hop(to: "slow")
        })
    engine.register(step: "slow") { _ in
        if blocking == "step" { blocker.block() }
    }
    engine.register(
        Flow("quick", version: "1") { flow in
            if try await flow.isFirstUse("tour") { try await flow.markUsed("tour") }
            try await flow.hop(to: "instant")
        })
    engine.register(step: "instant") { _ in }

    let slow = Task {
        let run = try await engine.start("blocking", subject: "a")
        // The caller's own code, once the start returned: here it blocks its thread.
        if blocking == "caller" { blocker.block() }
        return run
    }
    try await waitUntil("the blocking code runs") { blocker.entered.load(ordering: .relaxed) }
    say("blocking")
    let quick = try await engine.start("quick", subject: "b")
    let settled = try await engine.settled(runID: quick.id)
    guard settled?.status == .completed else {
        throw TestFailure("the quick run settled \(settled?.status.rawValue ?? "nowhere")")
    }
    say(
        blocker.returned.load(ordering: .relaxed)
            ? "quick completed after the blocking code returned" : "quick completed while blocked")
    blocker.released.store(true, ordering: .relaxed)
    let ended = try await engine.settled(runID: slow.value.id)
    guard ended?.status == .completed else {
        throw TestFailure("the blocking run settled \(ended?.status.rawValue ?? "nowhere")")
    }
    say("blocking run completed")
    crowd.open()
}

do {
    try await main()
} catch {
    FileHandle.standardError.write(Data("hop-test-blocking: \(error)\n".utf8))
    exit(1)
}
