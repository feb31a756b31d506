import Foundation
import HopStore
import HopTestSupport
import Testing

/// The README's tour, run against the built `hop-demo` and `hopctl`.
@Suite struct DemoTests {
    @Test func autoRunsTwiceTheSecondSkipsOnboardingAndLoginUntilFirstUseIsReset() async throws {
        let folder = try TemporaryDirectory()
        let first = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(first.status == 0, "\(first.stderr)")
        for line in ["hop    -> splash", "first use of onboarding: yes", "hop    -> onboarding", "stored session: none", "hop    -> login", "hop    -> main", "run 1 is completed"] {
            #expect(first.stdout.contains(line), "first run lacks \"\(line)\":\n\(first.stdout)")
        }

        let second = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(second.status == 0)
        #expect(second.stdout.contains("first use of onboarding: no") && second.stdout.contains("stored session: alice"))
        #expect(!second.stdout.contains("-> onboarding") && !second.stdout.contains("-> login"))
        #expect(second.stdout.contains("hop    -> main") && second.stdout.contains("run 2 is completed"))

        let reset = try await run("hopctl", ["reset-first-use", "onboarding", "--db", folder.database], in: folder)
        #expect(reset.status == 0)
        let third = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(third.stdout.contains("hop    -> onboarding") && !third.stdout.contains("-> login"))

        let logout = try await run("hopctl", ["session", "logout", "--db", folder.database], in: folder)
        #expect(logout.status == 0)
        let fourth = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(!fourth.stdout.contains("-> onboarding") && fourth.stdout.contains("hop    -> login"))
    }

    @Test func killedWhileWaitingOnOnboardingItResumesThereWithoutShowingSplashAgain() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        try await first.waitForOutput("run `hopctl --db \(folder.database) unhop --flow startup`")
        first.kill(SIGKILL)
        try await first.waitForExit()

        let second = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("resuming run 1 of startup for default at onboarding")
        try await second.waitForOutput("parked at onboarding")
        #expect(try await run("hopctl", ["unhop", "--flow", "startup", "--db", folder.database], in: folder).status == 0)
        try await second.waitForOutput("run `hopctl --db \(folder.database) session login alice`")
        #expect(try await run("hopctl", ["session", "login", "alice", "--db", folder.database], in: folder).status == 0)
        try await second.waitForOutput("run 1 is completed")
        #expect(try await second.waitForExit() == 0)
        #expect(!second.stdout.contains("splash"), "splash was shown again:\n\(second.stdout)")
    }

    @Test func sigtermStopsCleanlyAndTheRunStaysResumable() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
        try await demo.waitForOutput("parked at onboarding")
        demo.kill(SIGTERM)
        #expect(try await demo.waitForExit() == 0)
        #expect(!demo.wasSignalled)
        #expect(demo.stdout.contains("stays resumable at onboarding"))
        let store = try await HopStore.open(path: folder.database)
        let runRecord = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        #expect(runRecord.status == .parked && runRecord.currentStep == "onboarding")
    }
}
