import Foundation
import HopStore
import HopTestSupport
import Testing

/// Behaviour across processes: an engine in a daemon process, steered from this one.
@Suite struct ProcessTests {
    @Test func anUnhopWrittenByAnotherProcessMovesTheRunningEngineOn() async throws {
        let folder = try TemporaryDirectory()
        let daemon = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--external"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked onboarding")
        let store = try await HopStore.open(path: folder.database)
        _ = try await store.unhopParked(
            flow: "startup", subject: "default", step: "onboarding", output: #"{"accepted":true}"#)
        try await daemon.waitForOutput("parked login")
        try await store.storeSession(subject: "default", userID: "alice", token: "secret")
        try await daemon.waitForOutput("settled completed")
        #expect(try await daemon.waitForExit() == 0)
    }

    @Test func aSessionStoredWhileTheDaemonWasDownIsSeenWhenItResumes() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--external"], directory: folder)
        try await first.waitForOutput("parked onboarding")
        first.kill()
        try await first.waitForExit()

        let store = try await HopStore.open(path: folder.database)
        _ = try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding")
        try await store.storeSession(subject: "default", userID: "alice", token: "secret")

        let second = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--external"], directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("settled completed")
        let run = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        let steps = try await store.history(runID: run.id).filter { $0.kind == .hop }.map { $0.step ?? "" }
        #expect(steps == ["splash", "onboarding", "main"])
        let bodies = try String(contentsOfFile: folder.database + ".bodies", encoding: .utf8)
        #expect(
            bodies.split(separator: "\n").filter { $0.hasSuffix(" splash") }.count == 1,
            "splash did not run again on resume")
    }

    @Test func aFailingStepIsRetriedInTheDaemonAndFailsTheRunAfterItsLastAttempt() async throws {
        let folder = try TemporaryDirectory()
        let recovered = try await run(
            "hop-test-daemon", ["--db", folder.database], environment: ["HOP_TEST_FAILS": "2"], in: folder)
        #expect(recovered.stdout.contains("settled completed"), "\(recovered.stdout)\(recovered.stderr)")

        let other = try TemporaryDirectory()
        let failed = try await run(
            "hop-test-daemon", ["--db", other.database], environment: ["HOP_TEST_FAILS": "3"], in: other)
        #expect(failed.stdout.contains("settled failed"), "\(failed.stdout)\(failed.stderr)")
        let store = try await HopStore.open(path: other.database)
        let runRecord = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        #expect(
            try await store.history(runID: runRecord.id).last?.value?.contains(
                "splash could not load its cache (attempt 3)") == true)
    }

    @Test func restartingTheDaemonWithChangedFlowCodeMarksTheRunDiverged() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--external"], directory: folder)
        try await first.waitForOutput("parked onboarding")
        first.kill()
        try await first.waitForExit()
        let store = try await HopStore.open(path: folder.database)
        _ = try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding")

        // The code changed without a new version: under the run's version, it asks for another path.
        let second = try await run(
            "hop-test-daemon", ["--db", folder.database, "--version", "1", "--code", "2"], in: folder)
        #expect(second.stdout.contains("settled diverged"), "\(second.stdout)\(second.stderr)")
    }
}
