import Foundation
import HopStore
import HopTestSupport
import Testing

/// Flow versions side by side in real daemon processes, across SIGKILL and a new build.
@Suite struct VersionProcessTests {
    @Test func runsOfTwoVersionsInFlightAcrossASIGKILLEachFinishOnTheirOwnVersion() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        // The old build (version 1 only) parks kiosk-1 at onboarding and is killed.
        let old = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--subject", "kiosk-1"], directory: folder)
        try await old.waitForOutput("parked onboarding")
        old.kill()
        _ = try await old.waitForExit()

        // The new build registers version 2 beside version 1; kiosk-2's run starts on version 2 and
        // the process is killed between two of its steps.
        let newBuild = ["--db", folder.database, "--external", "--versions", "1,2"]
        let first = try ChildProcess(
            "hop-test-daemon", newBuild + ["--subject", "kiosk-2"],
            environment: ["HOP_TEST_KILL_AT": "after:unhop:splash"],
            directory: folder)
        _ = try await first.waitForExit()
        #expect(first.wasSignalled, "\(first.stdout)\(first.stderr)")
        let kiosk1 = try #require(try await store.latestRun(flow: "startup", subject: "kiosk-1"))
        let kiosk2 = try #require(try await store.latestRun(flow: "startup", subject: "kiosk-2"))
        #expect(kiosk1.flowVersion == "1" && kiosk2.flowVersion == "2")

        // An operator finishes kiosk-1's onboarding and logs its user in while no daemon runs.
        for arguments in [
            ["unhop", "--flow", "startup", "--subject", "kiosk-1", "--step", "onboarding"],
            ["session", "login", "alice", "--subject", "kiosk-1"],
        ] {
            let result = try await run("hopctl", arguments + ["--db", folder.database], in: folder)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
        }

        // The new build again: both runs resume, each on its own version, and complete.
        let second = try ChildProcess(
            "hop-test-daemon", newBuild + ["--subject", "kiosk-2", "--wait-all"], directory: folder)
        #expect(try await second.waitForExit() == 0, "\(second.stdout)\(second.stderr)")
        for (run, expected) in [
            (kiosk1, ["hop splash", "hop onboarding", "hop main"]),
            (kiosk2, ["hop splash", "hop main"]),
        ] {
            #expect(try await store.run(id: run.id)?.status == .completed)
            let history = try await store.history(runID: run.id)
            #expect(!history.contains { $0.kind == .diverge }, "run \(run.id) diverged")
            let path = history.filter { $0.kind == .hop || $0.kind == .timer }.map {
                "\($0.kind.rawValue) \($0.step ?? "")"
            }
            #expect(path == expected, "run \(run.id) of version \(run.flowVersion)")
        }
    }
}
