import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

@Suite struct RunHistoryTests {
    @Test func runRoundTripsAndAtMostOneUnfinishedRunExistsPerSubject() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (first, created) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        #expect(created)
        #expect(
            first.status == .running && first.flow == "startup" && first.subject == "default"
                && first.flowVersion == "1")
        let (again, createdAgain) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        #expect(!createdAgain)
        #expect(again.id == first.id)
        let (other, _) = try await store.startRun(flow: "startup", subject: "kiosk-2", version: "1")
        #expect(other.id != first.id)
        #expect(try await store.run(id: first.id) == first)
        #expect(try await store.runs(flow: "startup").map(\.subject) == ["default", "kiosk-2"])
    }

    @Test func historyIsNumberedInOrderPerRun() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (a, _) = try await store.startRun(flow: "startup", subject: "a", version: "1")
        let (b, _) = try await store.startRun(flow: "startup", subject: "b", version: "1")
        let hop = try await store.recordHop(runID: a.id, step: "splash")
        try await store.recordHop(runID: b.id, step: "splash")
        try await store.recordUnhop(runID: a.id, token: try #require(hop.token), output: #"{"ok":true}"#)
        try await store.recordDecision(runID: a.id, name: "isFirstUse(onboarding)", value: "true")
        try await store.recordHop(runID: a.id, step: "onboarding", from: "splash", parks: true)
        let history = try await store.history(runID: a.id)
        #expect(history.map(\.seq) == [1, 2, 3, 4, 5])
        #expect(history.map(\.kind) == [.hop, .unhop, .decision, .transition, .hop])
        #expect(history.map(\.step) == ["splash", "splash", "isFirstUse(onboarding)", "onboarding", "onboarding"])
        #expect(history[1].value == #"{"ok":true}"#)
        #expect(try await store.history(runID: a.id, limit: 2).map(\.seq) == [4, 5])
        #expect(try await store.history(runID: b.id).map(\.seq) == [1])
        let run = try #require(try await store.run(id: a.id))
        #expect(run.status == .parked && run.currentStep == "onboarding" && run.currentToken == history[4].token)
    }

    @Test func severalRecordsOfARunAreWrittenTogetherOrNotAtAll() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.recordHop(runID: run.id, step: "splash")
        let token = try #require(hop.token)
        // The last write is refused (a stale token): the decision and the effect before it are undone too.
        let refused = await #expect(throws: HopError.self) {
            try await store.record(
                [
                    .decision(name: "isFirstUse(onboarding)", value: "true"), .markUsed(feature: "onboarding"),
                    .unhop(token: "stale", output: nil),
                ], runID: run.id, owner: nil, durability: .now)
        }
        #expect(refused?.code == .refused)
        #expect(try await store.history(runID: run.id).map(\.kind) == [.hop])
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding"))
        let entries = try await store.record(
            [.unhop(token: token, output: nil), .decision(name: "session", value: "null"), .complete],
            runID: run.id, owner: nil, durability: .now)
        #expect(entries.map(\.seq) == [2, 3, 4])
        #expect(entries.map(\.kind) == [.unhop, .decision, .complete])
        #expect(try await store.run(id: run.id)?.status == .completed)
    }

    @Test func readingARunsHistoryUsesTheIndexNotAScan() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let plan = try await store.explain("SELECT run_id, seq FROM history WHERE run_id = ?1 ORDER BY seq")
        #expect(plan.contains { $0.contains("SEARCH history USING PRIMARY KEY (run_id=?)") }, "\(plan)")
    }

    /// The statements that look for unfinished runs read an index that holds those runs only:
    /// their cost must not grow with the finished runs a database keeps (a daemon's years).
    /// `status = 'running'` alone led SQLite to every run of the flow, sorted in a temporary
    /// B-tree; finding a subject's waking runs read the whole table.
    @Test func findingUnfinishedRunsReadsTheirIndexNeverEveryRun() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        // (Running and parked runs are two ranges of the index, so those without a patch are
        // sorted after the search: `sorted`.)
        let statements = [
            ("claimable runs", HopStore.claimableRunsSQL, "runs_unfinished (status=? AND flow=?)", false),
            ("running runs", HopStore.unfinishedRunsSQL(.running), "runs_unfinished (status=? AND flow=?)", false),
            ("parked runs", HopStore.unfinishedRunsSQL(.parked), "runs_unfinished (status=? AND flow=?)", false),
            ("waking runs", HopStore.wakingRunsSQL, "runs_waking (subject=? AND wake_on=?)", false),
            ("runs without a patch", HopStore.runsWithoutPatchSQL, "runs_unfinished (status=? AND flow=?)", true),
            // The due steps: both searches (each index holds one kind of deadline), then sorted.
            (
                "due steps of this boot", HopStore.dueTimeoutsSQL,
                "runs_by_wake_uptime (wake_boot=? AND wake_uptime<?)", true
            ),
            ("due steps of no boot", HopStore.dueTimeoutsSQL, "runs_by_wake_at (wake_at<?)", true),
        ]
        for (what, sql, index, sorted) in statements {
            let plan = try await store.explain(sql)
            #expect(plan.contains { $0.contains("SEARCH runs USING INDEX \(index)") }, "\(what): \(plan)")
            let sorts = !sorted && plan.contains { $0.contains("TEMP B-TREE") }
            #expect(!sorts && !plan.contains { $0.hasPrefix("SCAN runs") }, "\(what): \(plan)")
        }
        // The newest run of a flow (`hopctl start` takes its version): its id in one search of
        // the index by flow and id, not every run of the flow read (and sorted).
        let newest = try await store.explain(HopStore.newestVersionSQL)
        #expect(newest.contains { $0.contains("USING COVERING INDEX runs_by_flow (flow=?)") }, "\(newest)")
        #expect(!newest.contains { $0.contains("TEMP B-TREE") }, "\(newest)")
        // The flows that have runs, and a subject's newest runs without naming the flow
        // (`hopctl status --subject`): one search of the index per flow, never all of it.
        let subjects = try await store.explain(HopStore.latestRunsSQL(flow: false, subject: true, status: nil))
        for (what, plan) in [
            ("flow names", try await store.explain(HopStore.flowNamesSQL)), ("a subject's runs", subjects),
        ] {
            #expect(
                plan.contains { $0.contains("SEARCH runs USING COVERING INDEX runs_by_flow (flow>?)") },
                "\(what): \(plan)")
            #expect(!plan.contains { $0.hasPrefix("SCAN runs") }, "\(what): \(plan)")
        }
        // A flow's patches (`hopctl patches`): their markers from their own index, not every
        // history entry of the flow.
        let patches = try await store.explain(HopStore.patchesSQL)
        #expect(patches.first?.contains("SCAN h USING INDEX history_patches") == true, "\(patches)")
        #expect(patches.contains { $0.hasPrefix("SEARCH r USING") && $0.contains("rowid=?") }, "\(patches)")
        #expect(subjects.contains { $0.contains("runs_by_flow_subject (flow=? AND subject=?)") }, "\(subjects)")
        // A flow's hop graph (`hopctl graph`): the flow's runs in order of id, each one's hops in
        // order from history's primary key, never sorted (8 s at 5,000,000 hops with a sort).
        let graph = try await store.explain(HopStore.hopGraphSQL)
        #expect(graph.contains { $0.contains("SEARCH r USING COVERING INDEX runs_by_flow (flow=?)") }, "\(graph)")
        #expect(graph.contains { $0.contains("SEARCH h USING PRIMARY KEY (run_id=?)") }, "\(graph)")
        #expect(!graph.contains { $0.contains("TEMP B-TREE") }, "\(graph)")
    }

    /// `hopctl status`'s statements (`LatestRuns`): a running or parked listing reads an index of
    /// unfinished runs, never every run; a subject without a flow is searched flow by flow; a
    /// listing without a status or subject finds its pairs of flow and subject one search after
    /// another, reading none of their older runs (grouping the runs read every run of the pairs
    /// listed: 0.13 s at 1,000,000 runs of 1,000 subjects); and no statement groups runs in a
    /// temporary B-tree (0.2 s at 1,000,000 runs, whatever the limit).
    @Test func statusListingsSearchTheirIndexes() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        for flow in [false, true] {
            for subject in [false, true] {
                let what = "flow \(flow), subject \(subject)"
                for status in [RunStatus.running, .parked] {
                    let plan = try await store.explain(
                        HopStore.latestRunsSQL(flow: flow, subject: subject, status: status))
                    // Either index of unfinished runs (by status and flow, or by flow and subject).
                    #expect(
                        plan.first?.hasPrefix("SEARCH r USING INDEX runs_unfinished") == true,
                        "\(what), \(status): \(plan)")
                    #expect(!plan.contains { $0.hasPrefix("SCAN") }, "\(what), \(status): \(plan)")
                }
                if !subject {
                    // No filter but the flow: the pairs of flow and subject one search after
                    // another (the next subject of the flow, or the next flow's first), and the
                    // newest run of each listed pair, never every run of them.
                    let plan = try await store.explain(HopStore.latestRunsSQL(flow: flow, subject: false, status: nil))
                    for search in [
                        "SEARCH n USING COVERING INDEX runs_by_flow_subject (flow=? AND subject>?)",
                        "SEARCH m USING COVERING INDEX runs_by_flow_subject (flow=? AND subject=?)",
                    ] + (flow ? [] : ["SEARCH n USING COVERING INDEX runs_by_flow_subject (flow>?)"]) {
                        #expect(plan.contains { $0.contains(search) }, "\(what): \(plan)")
                    }
                    #expect(!plan.contains { $0.contains("GROUP BY") }, "\(what): \(plan)")
                    #expect(!plan.contains { $0.hasPrefix("SCAN runs") && !$0.contains("COVERING INDEX") }, "\(plan)")
                }
                for status in subject ? [nil, RunStatus.completed] : [RunStatus.completed] {
                    let plan = try await store.explain(
                        HopStore.latestRunsSQL(flow: flow, subject: subject, status: status))
                    let newest =
                        switch (flow, subject) {
                        case (false, false): "SCAN runs USING COVERING INDEX runs_by_flow_subject"
                        case (true, false): "SEARCH runs USING COVERING INDEX runs_by_flow_subject (flow=?)"
                        case (true, true):
                            "SEARCH runs USING COVERING INDEX runs_by_flow_subject (flow=? AND subject=?)"
                        case (false, true): "SEARCH n USING COVERING INDEX runs_by_flow_subject (flow=? AND subject=?)"
                        }
                    #expect(plan.contains { $0 == newest }, "\(what), \(String(describing: status)): \(plan)")
                    #expect(
                        !plan.contains { $0.contains("GROUP BY") }, "\(what), \(String(describing: status)): \(plan)")
                    if subject && !flow {
                        #expect(
                            plan.contains { $0.contains("SEARCH runs USING COVERING INDEX runs_by_flow (flow>?)") },
                            "\(what), \(String(describing: status)): \(plan)")
                    }
                }
            }
        }
    }

    @Test func unhopIsExactlyOnceAndRefusalsChangeNothing() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.recordHop(runID: run.id, step: "onboarding", parks: true)
        let token = try #require(hop.token)

        let stale = await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: "not-the-token")
        }
        #expect(stale?.code == .refused)
        #expect(stale?.description.contains("stale or unknown") == true)
        let badJSON = await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: token, output: "{oops")
        }
        #expect(badJSON?.code == .invalidInput)
        #expect(try await store.history(runID: run.id).count == 1)

        try await store.recordUnhop(runID: run.id, token: token, output: "42")
        let twice = await #expect(throws: HopError.self) { try await store.recordUnhop(runID: run.id, token: token) }
        #expect(twice?.code == .refused)
        #expect(twice?.description.contains("already unhopped") == true)
        #expect(try await store.history(runID: run.id).map(\.kind) == [.hop, .unhop])
    }

    @Test func cancelledRunRefusesUnhopAndHop() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.recordHop(runID: run.id, step: "onboarding", parks: true)
        try await store.cancelRun(flow: "startup", subject: "default")
        let error = await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: hop.token ?? "")
        }
        #expect(error?.code == .refused)
        #expect(error?.description.contains("cancelled") == true)
        await #expect(throws: HopError.self) { try await store.recordHop(runID: run.id, step: "main") }
        #expect(try await store.history(runID: run.id).map(\.kind) == [.hop, .cancel])
    }

    @Test func restartKeepsTheOldHistoryAndStartsANewRun() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.recordHop(runID: run.id, step: "splash")
        let fresh = try await store.restartRun(flow: "startup", subject: "default")
        #expect(fresh.id != run.id && fresh.status == .running && fresh.flowVersion == "1")
        #expect(try await store.run(id: run.id)?.status == .cancelled)
        #expect(try await store.history(runID: run.id).map(\.kind) == [.hop, .restart])
        #expect(try await store.history(runID: fresh.id).isEmpty)
        #expect(try await store.latestRun(flow: "startup", subject: "default")?.id == fresh.id)
    }

    @Test func parkedUnhopFinishesOnlyAParkedStep() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.recordHop(runID: run.id, step: "splash")
        let busy = await #expect(throws: HopError.self) {
            try await store.unhopParked(flow: "startup", subject: "default", step: "splash")
        }
        #expect(busy?.description.contains("executing in the daemon") == true)
        let missing = await #expect(throws: HopError.self) {
            try await store.unhopParked(flow: "startup", subject: "nobody", step: "splash")
        }
        #expect(missing?.code == .notFound)
    }

    @Test func aRetriedUnhopNeverFinishesTheNextStepAndALoginStepWaitsForASession() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.recordHop(runID: run.id, step: "onboarding", parks: true)
        _ = try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding")
        // The retry of the same command: the run has moved on and is parked on login now.
        try await store.recordHop(runID: run.id, step: "login", parks: true, wakeOn: .sessionStored)
        let before = try await store.history(runID: run.id)
        let retried = await #expect(throws: HopError.self) {
            try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding")
        }
        #expect(retried?.code == .refused)
        #expect(
            retried?.description.contains("is not parked on 'onboarding': it is parked on 'login'") == true,
            "\(retried!)")
        let login = await #expect(throws: HopError.self) {
            try await store.unhopParked(flow: "startup", subject: "default", step: "login")
        }
        #expect(login?.description.contains("hopctl session login") == true, "\(login!)")
        #expect(try await store.history(runID: run.id) == before, "a refusal changes nothing")
        #expect(try await store.run(id: run.id)?.currentStep == "login")
    }

    @Test func hopGraphCountsTheObservedEdges() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        // Runs that hop in turns, so that their history entries interleave in time, with other
        // records between their hops, and a run of another flow whose hops must not count.
        let paths = [
            ("a", ["splash", "onboarding", "main"]), ("b", ["splash", "main"]), ("c", ["splash", "main", "main"]),
        ]
        var runs: [Int64] = []
        for (subject, _) in paths {
            runs.append(try await store.startRun(flow: "startup", subject: subject, version: "1").0.id)
        }
        let otherRun = try await store.startRun(flow: "other", subject: "a", version: "1").0.id
        for index in 0..<3 {
            for (run, (_, steps)) in zip(runs, paths) where index < steps.count {
                let hop = try await store.recordHop(runID: run, step: steps[index])
                _ = try await store.record(
                    [.unhop(token: hop.token ?? "", output: nil), .decision(name: "d\(index)", value: "1")],
                    runID: run, owner: nil, durability: .now)
            }
            let hop = try await store.recordHop(runID: otherRun, step: "splash")
            try await store.recordUnhop(runID: otherRun, token: hop.token ?? "")
        }
        let edges = try await store.hopGraph(flow: "startup")
        #expect(
            edges == [
                HopEdge(from: nil, to: "splash", count: 3), HopEdge(from: "splash", to: "main", count: 2),
                HopEdge(from: "main", to: "main", count: 1), HopEdge(from: "onboarding", to: "main", count: 1),
                HopEdge(from: "splash", to: "onboarding", count: 1),
            ], "\(edges)")
        let other = try await store.hopGraph(flow: "other")
        #expect(other == [HopEdge(from: "splash", to: "splash", count: 2), HopEdge(from: nil, to: "splash", count: 1)])
        #expect(try await store.hopGraph(flow: "none").isEmpty)
    }

    @Test func aLoginStepEnteredAfterTheSessionWasStoredEndsAtOnce() async throws {
        // The login raced the hop: the session was stored between the flow's check and its hop to login.
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.storeSession(subject: "default", userID: "alice", token: "t")
        try await store.recordHop(runID: run.id, step: "login", parks: true, wakeOn: .sessionStored)
        #expect(
            try await store.run(id: run.id)?.status == .running, "the login step waits for a login that already came")
        let history = try await store.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop] && history.last?.value == #"{"userID":"alice"}"#)

        // And a step that lasts while a session is stored, entered when none is, is re-routed at once.
        try await store.deleteSession(subject: "default")
        try await store.recordHop(runID: run.id, step: "main", parks: true, wakeOn: .sessionRemoved)
        #expect(try await store.run(id: run.id)?.status == .running)
        #expect(try await store.history(runID: run.id).last?.kind == .reroute)
    }
}
