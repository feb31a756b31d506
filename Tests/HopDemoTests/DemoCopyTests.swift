import Foundation
import HopTestSupport
import Testing

/// `hopctl copy` moves a live demo deployment from a file to PostgreSQL and back.
@Suite struct DemoCopyTests {
    @Test(.enabled(if: TestBackend.all.contains { $0.name == "postgres" }))
    func aLiveDemoDatabaseMovesToPostgreSQLAndBackAndTheRunGoesOnThere() async throws {
        let folder = try TemporaryDirectory()
        let file = folder.database
        // A first start completed (first use and a session recorded), then a second waiting at onboarding.
        #expect(try await run("hop-demo", ["--auto", "--db", file], in: folder).status == 0)
        #expect(try await run("hopctl", ["reset-first-use", "onboarding", "--db", file], in: folder).status == 0)
        let demo = try ChildProcess("hop-demo", ["--db", file], directory: folder)
        defer { demo.kill() }
        try await demo.waitForOutput("parked at onboarding")

        // Copied while the demo runs (it waits for an operator, holding no run).
        let serverFolder = try TemporaryDirectory()
        let server = try await TestBackend.postgres.location(serverFolder)
        let copy = try await run("hopctl", ["copy", "--from", file, "--to", server], in: folder)
        #expect(copy.status == 0 && copy.stdout.contains("copied 2 runs"), "\(copy.stdout)\(copy.stderr)")
        #expect(!copy.stderr.contains("warning"), "\(copy.stderr)")
        for arguments in [["status", "--json"], ["history", "--flow", "startup", "--all-runs", "--json"]] {
            let here = try await run("hopctl", arguments + ["--db", file], in: folder)
            let there = try await run("hopctl", arguments + ["--db", server], in: folder)
            #expect(here.status == 0 && here.stdout == there.stdout, "\(arguments): \(here.stdout)\n\(there.stdout)")
        }
        demo.kill(SIGTERM)
        _ = try await demo.waitForExit()

        // The demo on the server resumes the run where it waits, and an operator moves it on there.
        let moved = try ChildProcess("hop-demo", ["--db", server], directory: folder)
        defer { moved.kill() }
        try await moved.waitForOutput("resuming run 2 of startup for default at onboarding")
        #expect(
            try await run("hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", server], in: folder)
                .status == 0)
        try await moved.waitForOutput("run 2 is completed")
        #expect(try await moved.waitForExit() == 0)
        #expect(!moved.stdout.contains("splash"), "splash was shown again:\n\(moved.stdout)")

        // And back into a new file, where a demo finds it all done.
        let back = folder.path("back.sqlite")
        let copyBack = try await run("hopctl", ["copy", "--from", server, "--to", back], in: folder)
        #expect(copyBack.status == 0, "\(copyBack.stderr)")
        let history = try await run(
            "hopctl", ["history", "--flow", "startup", "--all-runs", "--json", "--db", back], in: folder)
        let historyThere = try await run(
            "hopctl", ["history", "--flow", "startup", "--all-runs", "--json", "--db", server], in: folder)
        #expect(history.stdout == historyThere.stdout)
        let third = try await run("hop-demo", ["--auto", "--db", back], in: folder)
        #expect(third.status == 0 && third.stdout.contains("run 3 is completed"), "\(third.stdout)")
        #expect(!third.stdout.contains("-> onboarding") && !third.stdout.contains("-> login"), "\(third.stdout)")
    }
}
