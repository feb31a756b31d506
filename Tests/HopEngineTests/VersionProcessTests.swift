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

    @Test func hopctlShowsWhereARunDivergedAndAForkFromTheLastAgreeingEntryCompletesIt() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-test-daemon", ["--db", folder.database, "--external"], directory: folder)
        try await first.waitForOutput("parked onboarding")
        first.kill()
        _ = try await first.waitForExit()
        let hopctl = ["--db", folder.database, "--flow", "startup"]
        let unhop = try await run("hopctl", ["unhop", "--step", "onboarding"] + hopctl, in: folder)
        #expect(unhop.status == 0, "\(unhop.stderr)")
        // Version 1's code changed in place: main follows splash.
        let changed = ["--db", folder.database, "--version", "1", "--code", "2"]
        let diverging = try await run("hop-test-daemon", changed, in: folder)
        #expect(diverging.stdout.contains("settled diverged"), "\(diverging.stdout)\(diverging.stderr)")

        let status = try await run(
            "hopctl", ["status", "--status", "diverged", "--json", "--db", folder.database], in: folder)
        let rows = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [[String: Any]])
        let diverged = try #require(rows.first?["diverged"] as? [String: Any], "\(status.stdout)")
        #expect(
            rows.count == 1 && diverged["code_version"] as? String == "1" && diverged["run_version"] as? String == "1")
        let entry = try #require((diverged["entry"] as? NSNumber)?.int64Value)
        let table = try await run("hopctl", ["status", "--status", "diverged", "--db", folder.database], in: folder)
        #expect(table.stdout.contains("DIVERGED AT") && table.stdout.contains("entry \(entry)"), "\(table.stdout)")

        let fork = try await run("hopctl", ["fork", "--from", "\(entry - 1)", "--json"] + hopctl, in: folder)
        #expect(fork.status == 0, "\(fork.stderr)")
        let forked = try #require(try JSONSerialization.jsonObject(with: Data(fork.stdout.utf8)) as? [String: Any])
        let newRun = try #require(((forked["new"] as? [String: Any])?["run"] as? NSNumber)?.int64Value)
        let completing = try await run("hop-test-daemon", changed, in: folder)
        #expect(completing.stdout.contains("settled completed"), "\(completing.stdout)\(completing.stderr)")
        let bodies = (try? String(contentsOfFile: folder.database + ".bodies", encoding: .utf8)) ?? ""
        #expect(!bodies.contains("\(newRun) splash"), "splash ran again in the forked run: \(bodies)")
        #expect(bodies.contains("\(newRun) main"), "\(bodies)")
        let empty = try await run("hopctl", ["status", "--status", "diverged", "--db", folder.database], in: folder)
        #expect(empty.stdout.isEmpty && empty.stderr.contains("no diverged runs"), "\(empty.stdout)\(empty.stderr)")

        let refused = try await run("hopctl", ["fork", "--from", "99"] + hopctl, in: folder)
        #expect(refused.status != 0 && refused.stderr.contains("has no entry 99"), "\(refused.stderr)")
    }

    @Test func aPatchDeployedWhileRunsWaitKeepsRunsPastItOnTheOldBranchAcrossASIGKILL() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let hopctl = ["--db", folder.database, "--flow", "startup"]
        func steer(_ arguments: [String], flow: Bool = true) async throws {
            let result = try await run("hopctl", arguments + (flow ? hopctl : ["--db", folder.database]), in: folder)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
        }
        // The build before the patch: user-0 gets past the patch's place (to login), user-1 waits before it.
        let past = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--subject", "user-0"], directory: folder)
        try await past.waitForOutput("parked onboarding")
        try await steer(["unhop", "--step", "onboarding", "--subject", "user-0"])
        try await past.waitForOutput("parked login")
        past.kill()
        _ = try await past.waitForExit()
        let before = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--subject", "user-1"], directory: folder)
        try await before.waitForOutput("parked onboarding")
        before.kill()
        _ = try await before.waitForExit()
        try await steer(["unhop", "--step", "onboarding", "--subject", "user-1"])
        for user in ["user-0", "user-1", "user-2"] {
            try await steer(["session", "login", "alice", "--subject", user], flow: false)
        }

        // The patched build, killed right after the first marker is recorded, then started again.
        let patched = ["--db", folder.database, "--external", "--patch", "--subject", "user-2", "--wait-all"]
        let killed = try ChildProcess(
            "hop-test-daemon", patched, environment: ["HOP_TEST_KILL_AT": "after:patch:terms-screen"], directory: folder
        )
        _ = try await killed.waitForExit()
        #expect(killed.wasSignalled, "\(killed.stdout)\(killed.stderr)")
        let again = try ChildProcess("hop-test-daemon", patched, directory: folder)
        // user-2 is a first use: it parks at onboarding (in either process).
        try await waitUntil("user-2 is parked at onboarding") {
            let run = try await store.latestRun(flow: "startup", subject: "user-2")
            return run?.status == .parked && run?.currentStep == "onboarding"
        }
        try await steer(["unhop", "--step", "onboarding", "--subject", "user-2"])
        #expect(try await again.waitForExit() == 0, "\(again.stdout)\(again.stderr)")

        for (user, expected) in [
            ("user-0", ["splash", "onboarding", "login", "main"]),
            ("user-1", ["splash", "onboarding", "patch terms-screen", "terms", "main"]),
            ("user-2", ["splash", "onboarding", "patch terms-screen", "terms", "main"]),
        ] {
            let record = try #require(try await store.latestRun(flow: "startup", subject: user))
            #expect(record.status == .completed, "\(user)")
            let history = try await store.history(runID: record.id)
            let path = history.filter { $0.kind == .hop || $0.kind == .patch }.map {
                $0.kind == .patch ? "patch \($0.step ?? "")" : $0.step ?? ""
            }
            #expect(path == expected, "\(user)")
            #expect(!history.contains { $0.kind == .diverge }, "\(user) diverged")
        }
    }
}
