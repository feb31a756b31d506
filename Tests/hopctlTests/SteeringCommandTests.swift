import Foundation
import HopStore
import HopTestSupport
import Testing

@Suite struct SteeringCommandTests {
    @Test(arguments: TestBackend.all) func unhopFinishesTheStepAnEngineInAnotherProcessIsParkedOn(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        let daemon = try ChildProcess("hop-test-daemon", ["--db", db, "--external"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked onboarding")

        let unhop = try await hopctl(
            ["unhop", "--flow", "startup", "--step", "onboarding", "--output", #"{"accepted": true}"#], in: folder,
            db: db)
        #expect(unhop.status == 0, "\(unhop.stderr)")
        #expect(unhop.stdout.contains("unhopped onboarding"))
        try await daemon.waitForOutput("parked login")

        // The same command again (a retry, a double click): it must not finish login.
        let again = try await hopctl(["unhop", "--flow", "startup", "--step", "onboarding"], in: folder, db: db)
        #expect(again.status == 1, "a retried unhop finished the step after it")
        #expect(
            again.stderr.contains("run 1 is not parked on 'onboarding': it is parked on 'login'"), "\(again.stderr)")
        let login = try await hopctl(["unhop", "--flow", "startup", "--step", "login"], in: folder, db: db)
        #expect(login.status == 1 && login.stderr.contains("hopctl session login"), "\(login.stderr)")
        let store = try await backend.open(folder)
        #expect(try await store.run(id: 1)?.currentStep == "login")
        #expect(try await store.session(subject: "default") == nil)
        #expect(try await hopctl(["session", "login", "alice"], in: folder, db: db).status == 0)
        try await daemon.waitForOutput("settled completed")
        let nothing = try await hopctl(["unhop", "--flow", "startup", "--step", "main"], in: folder, db: db)
        #expect(nothing.status == 1)
        #expect(nothing.stderr.contains("no unfinished run of flow 'startup' for subject 'default'"))
        #expect(nothing.stderr.contains(backend.name == "sqlite" ? folder.database : "postgres://"))
    }

    /// A flow parks on the same step twice in a row (two approvals). `unhop --run ID --entry N`
    /// names the parking itself: the same command again (a retry after a timeout, a double click)
    /// must not finish the second approval, which `--step` alone cannot tell from the first.
    @Test(arguments: TestBackend.all) func aRetriedUnhopThatNamesItsEntryNeverFinishesTheNextParkingOnTheSameStep(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", db, "--external", "--flow", "review"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked approve")
        let store = try await backend.open(folder)
        func parking() async throws -> (entry: Int, text: String) {
            let listed = try #require(
                try await hopctlJSON(["status", "--flow", "review"], in: folder, db: db) as? [[String: Any]])
            let run = try #require(listed.first)
            let text = try await hopctl(["status", "--flow", "review"], in: folder, db: db).stdout
            return (try #require(run["current_step_entry"] as? Int, "\(run)"), text)
        }
        let first = try await parking()
        #expect(first.text.contains("approve (entry \(first.entry))"), "\(first.text)")

        let unhop = ["unhop", "--flow", "review", "--step", "approve", "--run", "1", "--entry", "\(first.entry)"]
        let done = try await hopctl(unhop, in: folder, db: db)
        #expect(done.status == 0, "\(done.stderr)")
        #expect(done.stdout.contains("unhopped approve (entry \(first.entry)) of run 1"), "\(done.stdout)")
        try await waitUntil("the run parks on the second approval") {
            let hops = try await store.history(runID: 1).filter { $0.kind == .hop }.count
            return try await store.run(id: 1)?.status == .parked && hops == 2
        }
        let second = try await parking()
        #expect(second.entry > first.entry)

        let again = try await hopctl(unhop, in: folder, db: db)
        #expect(again.status == 1, "a retried unhop finished the second approval")
        #expect(
            again.stderr.contains(
                "step 'approve' that entry \(first.entry) of run 1 entered has already unhopped; run 1 is now parked on "
                    + "'approve' (entry \(second.entry)); nothing was changed"),
            "\(again.stderr)")
        #expect(try await store.history(runID: 1).filter { $0.kind == .unhop && $0.step == "approve" }.count == 1)
        #expect(try await parking().entry == second.entry)

        // An entry that is no hop to the step, a run that is not the flow's: refused, nothing changed.
        let wrongEntry = try await hopctl(
            ["unhop", "--flow", "review", "--step", "approve", "--run", "1", "--entry", "999"], in: folder, db: db)
        #expect(
            wrongEntry.status == 1 && wrongEntry.stderr.contains("entry 999 of run 1 is not a hop to 'approve'"),
            "\(wrongEntry.stderr)")
        let wrongRun = try await hopctl(
            ["unhop", "--flow", "review", "--step", "approve", "--run", "7", "--entry", "\(second.entry)"], in: folder,
            db: db)
        #expect(
            wrongRun.status == 1 && wrongRun.stderr.contains("run 7 is not a run of flow 'review'"),
            "\(wrongRun.stderr)")
        let noRun = try await hopctl(
            ["unhop", "--flow", "review", "--step", "approve", "--entry", "\(second.entry)"], in: folder, db: db)
        #expect(noRun.status == 64 && noRun.stderr.contains("--entry needs --run"), "\(noRun.stderr)")
        #expect(try await store.history(runID: 1).filter { $0.kind == .unhop && $0.step == "approve" }.count == 1)

        let last = ["unhop", "--flow", "review", "--step", "approve", "--run", "1", "--entry", "\(second.entry)"]
        #expect(try await hopctl(last, in: folder, db: db).status == 0)
        try await daemon.waitForOutput("settled completed")
        let finished = try await hopctl(last, in: folder, db: db)
        #expect(
            finished.status == 1 && finished.stderr.contains("run 1 is already completed; nothing was changed"),
            "\(finished.stderr)")
        #expect(try await store.history(runID: 1).filter { $0.kind == .unhop && $0.step == "approve" }.count == 2)
    }

    /// `start --latest ID` (or `none`) starts a run only while ID is the subject's latest run of
    /// the flow: the same command again never starts a second run, even once the first one it
    /// started has finished (a plain `start` is refused only while that run is unfinished).
    @Test(arguments: TestBackend.all) func aRetriedStartThatNamesTheLatestRunNeverStartsASecondRun(
        backend: TestBackend
    ) async throws {
        let (folder, db, store) = try await completedStartup(on: backend)
        func runs() async throws -> [String] { try await startupRuns(in: store) }

        let start = ["start", "--flow", "startup", "--latest", "1"]
        let first = try await hopctl(start, in: folder, db: db)
        #expect(first.status == 0 && first.stdout.contains("started run 2"), "\(first.stdout)\(first.stderr)")
        // A daemon executes the run to its end before the command is tried again.
        try await completedStartup(folder, db: db)
        #expect(try await runs() == ["1 default completed", "2 default completed"])
        let again = try await hopctl(start, in: folder, db: db)
        #expect(again.status == 1, "a retried start started a second run")
        #expect(
            again.stderr.contains(
                "run 1 is not the latest run of flow 'startup' for subject 'default': run 2 (completed) came after it; "
                    + "nothing was changed") && again.stderr.contains("--latest 2"), "\(again.stderr)")
        // Without --latest, the finished run does not stop it: that is what --latest is for.
        #expect(try await runs() == ["1 default completed", "2 default completed"])

        // A subject's first run: `--latest none`.
        let kiosk = ["start", "--flow", "startup", "--subject", "kiosk", "--latest", "none"]
        #expect(try await hopctl(kiosk, in: folder, db: db).status == 0)
        let kioskAgain = try await hopctl(kiosk, in: folder, db: db)
        #expect(
            kioskAgain.status == 1
                && kioskAgain.stderr.contains(
                    "the subject has run 3 (running) of flow 'startup', not none; nothing was changed"),
            "\(kioskAgain.stderr)")
        let missing = try await hopctl(
            ["start", "--flow", "startup", "--subject", "printer", "--latest", "4"], in: folder, db: db)
        #expect(
            missing.status == 1
                && missing.stderr.contains("subject 'printer' has no run of flow 'startup'")
                && missing.stderr.contains("--latest none"), "\(missing.stderr)")
        for bad in ["0", "-1", "latest"] {
            let refused = try await hopctl(["start", "--flow", "startup", "--latest", bad], in: folder, db: db)
            #expect(refused.status == 64 && refused.stderr.contains("--latest"), "\(bad): \(refused.stderr)")
        }
        #expect(try await runs() == ["1 default completed", "2 default completed", "3 kiosk running"])
    }

    /// `restart --run ID` and `cancel --run ID` act only while ID is the run they would act on:
    /// the same command again (a retry after a timeout, a double click) changes nothing.
    @Test(arguments: TestBackend.all) func aRetriedRestartOrCancelThatNamesItsRunChangesNothing(
        backend: TestBackend
    ) async throws {
        let (folder, db, store) = try await completedStartup(on: backend)
        func runs() async throws -> [String] { try await startupRuns(in: store) }

        let restart = ["restart", "--flow", "startup", "--run", "1"]
        let first = try await hopctl(restart, in: folder, db: db)
        #expect(first.status == 0 && first.stdout.contains("run 2 of startup"), "\(first.stdout)\(first.stderr)")
        let again = try await hopctl(restart, in: folder, db: db)
        #expect(again.status == 1, "a retried restart started over the run the first one made")
        #expect(
            again.stderr.contains(
                "run 1 is already completed and run 2 (running) came after it; nothing was changed")
                && again.stderr.contains("--run 2"), "\(again.stderr)")
        #expect(try await runs() == ["1 default completed", "2 default running"])

        let cancelOld = try await hopctl(["cancel", "--flow", "startup", "--run", "1"], in: folder, db: db)
        #expect(cancelOld.status == 1 && cancelOld.stderr.contains("run 1 is already completed"), "\(cancelOld.stderr)")
        let cancel = ["cancel", "--flow", "startup", "--run", "2"]
        #expect(try await hopctl(cancel, in: folder, db: db).status == 0)
        let cancelAgain = try await hopctl(cancel, in: folder, db: db)
        #expect(
            cancelAgain.status == 1 && cancelAgain.stderr.contains("run 2 is already cancelled; nothing was changed"),
            "\(cancelAgain.stderr)")
        #expect(try await runs() == ["1 default completed", "2 default cancelled"])

        // A run of another flow or subject, or none, is not the run meant; 0 is no run id.
        for id in ["99", "1"] {
            let other = try await hopctl(
                ["cancel", "--flow", "startup", "--subject", "kiosk", "--run", id], in: folder, db: db)
            #expect(
                other.status == 1
                    && other.stderr.contains("run \(id) is not a run of flow 'startup' for subject 'kiosk'"),
                "\(other.stderr)")
        }
        #expect(try await hopctl(["restart", "--flow", "startup", "--run", "0"], in: folder, db: db).status == 64)
        #expect(try await runs() == ["1 default completed", "2 default cancelled"])
        // The latest run, finished, is still the one a restart naming it starts over.
        #expect(try await hopctl(["restart", "--flow", "startup", "--run", "2"], in: folder, db: db).status == 0)
        #expect(try await runs() == ["1 default completed", "2 default cancelled", "3 default running"])
    }

    @Test(arguments: TestBackend.all) func sessionLoginMovesARunWaitingOnLoginAndNeverPrintsTheToken(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        let daemon = try ChildProcess("hop-test-daemon", ["--db", db, "--external"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked onboarding")
        #expect(
            try await hopctl(["unhop", "--flow", "startup", "--step", "onboarding"], in: folder, db: db).status == 0)
        try await daemon.waitForOutput("parked login")

        let login = try await hopctl(
            ["session", "login", "alice", "--token-stdin", "--expires-in", "12h"], in: folder, db: db,
            stdin: "very-secret-token\n")
        #expect(login.status == 0, "\(login.stderr)")
        #expect(!login.stdout.contains("very-secret-token") && !login.stderr.contains("very-secret-token"))
        #expect(login.stdout.contains("was waiting for a login"))
        try await daemon.waitForOutput("settled completed")
        let store = try await backend.open(folder)
        let session = try #require(try await store.session(subject: "default"))
        #expect(session.token == "very-secret-token" && session.userID == "alice")
        #expect(abs((session.expiresAt?.timeIntervalSinceNow ?? 0) - 12 * 3600) < 60)

        let logout = try await hopctl(["session", "logout"], in: folder, db: db)
        #expect(logout.status == 0)
        #expect(try await store.session(subject: "default") == nil)
        let generated = try await hopctl(["session", "login", "bob", "--subject", "kiosk-2"], in: folder, db: db)
        #expect(generated.status == 0)
        let token = try #require(try await store.session(subject: "kiosk-2")?.token)
        #expect(token.count == 64 && !generated.stdout.contains(token))
    }

    /// `fork --run ID --from SEQ` tried again, once the run the first try made has finished (so
    /// no unfinished run refuses it), changes nothing: the steps after SEQ never run a third time.
    @Test(arguments: TestBackend.all) func aRetriedForkOfARunNeverForksItTwiceThroughTheSameEntry(
        backend: TestBackend
    ) async throws {
        let (folder, db, store) = try await completedStartup(on: backend)
        let history = try await store.history(runID: 1)
        // Through splash's end: the new run takes splash as done and goes on from there.
        let through = try #require(history.first { $0.kind == .unhop && $0.step == "splash" }?.seq)

        let fork = ["fork", "--flow", "startup", "--run", "1", "--from", "\(through)"]
        let first = try await hopctl(fork, in: folder, db: db)
        #expect(first.status == 0 && first.stdout.contains("into run 2"), "\(first.stdout)\(first.stderr)")
        try await completedStartup(folder, db: db)
        #expect(try await startupRuns(in: store) == ["1 default completed", "2 default completed"])

        let again = try await hopctl(fork, in: folder, db: db)
        #expect(again.status == 1, "a retried fork forked the run a second time")
        #expect(
            again.stderr.contains("run 1 was already forked through entry \(through), into run 2; nothing was changed"),
            "\(again.stderr)")
        #expect(try await startupRuns(in: store) == ["1 default completed", "2 default completed"])
        // Through another entry, it is another fork.
        let later = try #require(history.last { $0.kind == .unhop }?.seq)
        #expect(later > through)
        let other = try await hopctl(
            ["fork", "--flow", "startup", "--run", "1", "--from", "\(later)"], in: folder, db: db)
        #expect(other.status == 0 && other.stdout.contains("into run 3"), "\(other.stdout)\(other.stderr)")
    }

    /// `session logout --user alice` removes only alice's session: retried after bob logged in on
    /// the same subject, it changes nothing, so bob's main step is not re-routed to login.
    @Test(arguments: TestBackend.all) func aRetriedLogoutThatNamesItsUserNeverLogsOutTheNextUser(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        let daemon = try ChildProcess("hop-test-daemon", ["--db", db, "--external", "--reroute"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked onboarding")
        #expect(
            try await hopctl(["unhop", "--flow", "startup", "--step", "onboarding"], in: folder, db: db).status == 0)
        let store = try await backend.open(folder)
        func parkedOn(_ step: String, reroutes: Int) async throws {
            try await waitUntil("the run parks on \(step) after \(reroutes) re-routes") {
                let run = try await store.run(id: 1)
                let done = try await store.history(runID: 1).filter { $0.kind == .reroute }.count
                return run?.status == .parked && run?.currentStep == step && done == reroutes
            }
        }
        try await parkedOn("login", reroutes: 0)
        #expect(try await hopctl(["session", "login", "alice"], in: folder, db: db).status == 0)
        try await parkedOn("main", reroutes: 0)

        let logout = ["session", "logout", "--user", "alice"]
        let first = try await hopctl(logout, in: folder, db: db)
        #expect(first.status == 0 && first.stdout.contains("logged out default"), "\(first.stdout)\(first.stderr)")
        try await parkedOn("login", reroutes: 1)
        #expect(try await hopctl(["session", "login", "bob"], in: folder, db: db).status == 0)
        try await parkedOn("main", reroutes: 1)

        let again = try await hopctl(logout, in: folder, db: db)
        #expect(again.status == 1, "a retried logout logged bob out")
        #expect(
            again.stderr.contains("the session of subject 'default' is not alice's; nothing was changed"),
            "\(again.stderr)")
        #expect(try await store.session(subject: "default")?.userID == "bob")
        try await parkedOn("main", reroutes: 1)
        // Without a session stored, there is nothing to refuse: it says so, as a plain logout does.
        #expect(try await hopctl(["session", "logout", "--user", "bob"], in: folder, db: db).status == 0)
        let none = try await hopctl(logout, in: folder, db: db)
        #expect(none.status == 0 && none.stdout.contains("no session was stored"), "\(none.stdout)\(none.stderr)")
    }

    @Test(arguments: TestBackend.all) func cancelStopsTheRunAndRestartStartsANewOneKeepingHistory(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        let daemon = try ChildProcess("hop-test-daemon", ["--db", db, "--external"], directory: folder)
        try await daemon.waitForOutput("parked onboarding")
        daemon.kill()
        try await daemon.waitForExit()

        let cancel = try await hopctl(["cancel", "--flow", "startup"], in: folder, db: db)
        #expect(cancel.status == 0 && cancel.stdout.contains("cancelled run 1"))
        let status = try #require(try await hopctlJSON(["status"], in: folder, db: db) as? [[String: Any]])
        #expect(status.first?["status"] as? String == "cancelled")
        #expect(
            try await hopctl(["unhop", "--flow", "startup", "--step", "onboarding"], in: folder, db: db).status == 1)

        let restart = try await hopctl(["restart", "--flow", "startup"], in: folder, db: db)
        #expect(restart.status == 0 && restart.stdout.contains("run 2"))
        let store = try await backend.open(folder)
        #expect(try await store.allRuns(flow: "startup").map(\.status) == [.cancelled, .running])
        #expect(try await store.history(runID: 1).count >= 3)

        let resumed = try ChildProcess("hop-test-daemon", ["--db", db, "--external"], directory: folder)
        defer { resumed.kill() }
        try await resumed.waitForOutput("parked onboarding")
        #expect(resumed.stdout.contains("executing run 2 replaying 0"))
    }

    @Test(arguments: TestBackend.all) func resetFirstUseBringsOnboardingBack(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        try await completedStartup(folder, db: db)
        let reset = try await hopctl(["reset-first-use", "onboarding"], in: folder, db: db)
        #expect(reset.status == 0 && reset.stdout.contains("1 flag cleared"))
        #expect((try await hopctlJSON(["first-use", "list"], in: folder, db: db) as? [Any])?.isEmpty == true)
        let store = try await backend.open(folder)
        try await store.markUsed(subject: "default", feature: "a")
        try await store.markUsed(subject: "default", feature: "b")
        #expect(try await hopctl(["reset-first-use", "--all"], in: folder, db: db).stdout.contains("2 flags cleared"))
        #expect(try await hopctl(["reset-first-use"], in: folder, db: db).status == 64)
        #expect(try await hopctl(["reset-first-use", "x", "--all"], in: folder, db: db).status == 64)
    }

    /// `reset-first-use F --if-used-at T` (T as `first-use list` shows it) clears the flag only
    /// while it is the one set at T: retried once the flow has used F again, it changes nothing,
    /// so onboarding is not shown a third time.
    @Test(arguments: TestBackend.all) func aRetriedResetOfAFlagUsedAgainChangesNothing(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        try await completedStartup(folder, db: db)
        func usedAt() async throws -> String? {
            let flags = try #require(
                try await hopctlJSON(["first-use", "list"], in: folder, db: db) as? [[String: Any]])
            return flags.first { $0["feature"] as? String == "onboarding" }?["used_at"] as? String
        }
        let first = try #require(try await usedAt())
        let store = try await backend.open(folder)
        // The flag of the first run must be older than the second's, to the second.
        try await waitUntil("a second has passed since the flag was set") {
            store.now().timeIntervalSince1970.rounded(.down)
                > (try await store.firstUseFlags(subject: "default").first?.usedAt.timeIntervalSince1970 ?? 0)
        }

        let reset = ["reset-first-use", "onboarding", "--if-used-at", first]
        let done = try await hopctl(reset, in: folder, db: db)
        #expect(done.status == 0 && done.stdout.contains("1 flag cleared"), "\(done.stdout)\(done.stderr)")
        try await completedStartup(folder, db: db)  // shows onboarding again, and marks it used
        let second = try #require(try await usedAt())
        #expect(second != first)

        let again = try await hopctl(reset, in: folder, db: db)
        #expect(again.status == 1, "a retried reset cleared the flag the second run set")
        #expect(
            again.stderr.contains(
                "the first-use flag 'onboarding' of subject 'default' was set at \(second), not at \(first)")
                && again.stderr.contains("nothing was changed"), "\(again.stderr)")
        #expect(try await usedAt() == second)
        // Before the flow used it again, the retry finds nothing to clear, as a plain reset does.
        #expect(
            try await hopctl(["reset-first-use", "onboarding", "--if-used-at", second], in: folder, db: db).status == 0)
        let nothing = try await hopctl(reset, in: folder, db: db)
        #expect(nothing.status == 0 && nothing.stdout.contains("nothing to clear"), "\(nothing.stdout)")
        for bad in [
            ["onboarding", "--if-used-at", "yesterday"], ["a", "b", "--if-used-at", first],
            ["--all", "--if-used-at", first],
        ] {
            let refused = try await hopctl(["reset-first-use"] + bad, in: folder, db: db)
            #expect(refused.status == 64 && refused.stderr.contains("--if-used-at"), "\(bad): \(refused.stderr)")
        }
    }
}
