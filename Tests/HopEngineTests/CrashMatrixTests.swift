import Foundation
import HopStore
import HopTestSupport
import Testing

/// The core acceptance: the startup flow in a real process, SIGKILLed just before and just
/// after every record in turn — the 5 commits, and the records coalesced between them that a
/// kill loses — then restarted and run to the end.
@Suite struct CrashMatrixTests {
    struct Outcome {
        var history: [String]
        var bodies: [String: Int]
    }

    static func outcome(_ folder: TemporaryDirectory) async throws -> Outcome {
        let store = try await HopStore.open(path: folder.database)
        // The first run: a daemon started after that run completed starts a second one.
        // No run yet when the process died before a new run's first commit (its first hop).
        guard let run = try await store.allRuns(flow: "startup", subject: "default").first else {
            return Outcome(history: [], bodies: [:])
        }
        let history = try await store.history(runID: run.id)
            .filter { $0.kind.isReplayed || $0.kind == .complete }
            .map { "\($0.kind.rawValue) \($0.step ?? "")" }
        let steps = bodyLines(in: folder).filter { $0.hasPrefix("\(run.id) ") }.map {
            String($0.split(separator: " ")[1])
        }
        return Outcome(history: history, bodies: Dictionary(steps.map { ($0, 1) }, uniquingKeysWith: +))
    }

    static func uncrashed() async throws -> (points: [String], outcome: Outcome) {
        let folder = try TemporaryDirectory()
        let result = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
        #expect(result.status == 0, "\(result.stderr)")
        let points = result.stdout.split(separator: "\n").filter { $0.hasPrefix("point ") }.map {
            String($0.dropFirst(6))
        }
        return (points, try await outcome(folder))
    }

    @Test func killedAtEveryHopBoundaryTheFlowResumesToTheSameHistory() async throws {
        let (points, reference) = try await Self.uncrashed()
        #expect(
            reference.history == [
                "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding", "unhop onboarding",
                "effect markUsed(onboarding)", "decision session", "hop login", "unhop login", "hop main", "unhop main",
                "complete ",
            ])
        #expect(reference.bodies == ["splash": 1, "onboarding": 1, "login": 1, "main": 1])
        // Before and after each of the 12 records (committed in 5 transactions: a new run with its
        // first hop, the three other hops each with what the run recorded since the last, the completion).
        #expect(points.count == 24)

        for point in points {
            let folder = try TemporaryDirectory()
            let crashed = try ChildProcess(
                "hop-test-daemon", ["--db", folder.database], environment: ["HOP_TEST_KILL_AT": point],
                directory: folder)
            try await crashed.waitForExit()
            #expect(crashed.wasSignalled && crashed.exitStatus == SIGKILL, "not killed at \(point): \(crashed.stdout)")

            let before = try await Self.outcome(folder)
            // What survived is a prefix of the run: a coalesced record is never kept without
            // the records before it.
            #expect(Array(reference.history.prefix(before.history.count)) == before.history, "(e) after \(point)")
            // An effect and its flag are one: both survived or neither did.
            let flagSet = try await !HopStore.open(path: folder.database).isFirstUse(
                subject: "default", feature: "onboarding")
            #expect(
                flagSet == before.history.contains("effect markUsed(onboarding)"),
                "(f) the flag and its effect record parted after a kill at \(point)")
            let unhopped = Set(before.history.filter { $0.hasPrefix("unhop ") }.map { String($0.dropFirst(6)) })
            let hopped = Set(before.history.filter { $0.hasPrefix("hop ") }.map { String($0.dropFirst(4)) })
            let inFlight = hopped.subtracting(unhopped)
            #expect(inFlight.count <= 1, "at \(point)")

            let resumed = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
            #expect(resumed.status == 0, "resume after \(point): \(resumed.stderr)")
            #expect(resumed.stdout.contains("settled completed"), "resume after \(point): \(resumed.stdout)")

            let after = try await Self.outcome(folder)
            for step in ["splash", "onboarding", "login", "main"] {
                let ranBefore = before.bodies[step, default: 0]
                let ranAfter = after.bodies[step, default: 0]
                if unhopped.contains(step) {
                    #expect(ranAfter == ranBefore, "(a) completed step \(step) ran again after a kill at \(point)")
                } else if inFlight.contains(step) {
                    #expect(
                        ranAfter <= ranBefore + 1, "(b) in-flight step \(step) ran more than once more after \(point)")
                    #expect(ranAfter >= 1, "in-flight step \(step) never ran after \(point)")
                } else {
                    #expect(ranAfter == 1, "step \(step) ran \(ranAfter) times after a kill at \(point)")
                }
            }
            #expect(after.history == reference.history, "(c) history after a kill at \(point)")
            let store = try await HopStore.open(path: folder.database)
            #expect(try await store.integrityCheck() == ["ok"], "(d) integrity after a kill at \(point)")
        }
    }

    /// A body that awaits something of its own after a step that returned without unhopping
    /// (main; no record until the run's completion) does not keep the step's end waiting: once
    /// another process sees it, a SIGKILL and a restart never run the step again.
    @Test func aStepsEndIsDurableWhileTheBodyAwaitsSomethingElseAndSurvivesAKill() async throws {
        let (_, reference) = try await Self.uncrashed()
        let folder = try TemporaryDirectory()
        let paused = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database], environment: ["HOP_TEST_PAUSE_BEFORE_END": "1"],
            directory: folder)
        let ended = Array(reference.history.dropLast())  // all but the completion
        try await waitUntil("another process sees main's unhop", timeout: .seconds(30)) {
            try await Self.outcome(folder).history == ended
        }
        paused.kill()
        try await paused.waitForExit()
        #expect(try await Self.outcome(folder).bodies == reference.bodies)

        let resumed = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
        #expect(resumed.status == 0, "\(resumed.stderr)")
        let after = try await Self.outcome(folder)
        #expect(after.bodies == reference.bodies, "a step ran again")
        #expect(after.history == reference.history)
    }
}
