import Foundation
import HopStore
import HopStoreTestSupport
import HopTestSupport
import Testing

/// `hopctl start`: a run recorded from the command line is executed by the daemon that runs its
/// flow, as soon as it notices; a retried or mistyped command changes nothing.
@Suite struct StartCommandTests {
    @Test func aRunStartedByHopctlIsPickedUpByTheDaemonAndARetryOrATypoChangesNothing() async throws {
        let folder = try TemporaryDirectory()
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--subjects", "2"], keepInputOpen: true,
            directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("started 2", timeout: .seconds(60))
        let store = try await HopStore.open(path: folder.database)
        let version = try #require(try await store.latestRun(flow: "startup", subject: "user-0")).flowVersion

        let started = try #require(
            try await hopctlJSON(["start", "--flow", "startup", "--subject", "user-9"], in: folder) as? [String: Any])
        let runID = try #require(started["run"] as? Int64)
        #expect(started["subject"] as? String == "user-9" && started["flow_version"] as? String == version)
        // The daemon claims it through the change notification and runs it to its first external step.
        try await waitUntil("the daemon executes the run hopctl started") {
            try await store.run(id: runID)?.currentStep == "onboarding"
        }
        #expect(try await store.history(runID: runID).first?.step == "splash")

        // A retried command is refused, says which run stands in the way, and records nothing.
        let runsBefore = try await store.runs().count
        let retry = try await hopctl(["start", "--flow", "startup", "--subject", "user-9"], in: folder)
        #expect(retry.status == 1)
        #expect(
            retry.stderr.contains("run \(runID) of flow 'startup' for subject 'user-9' is unfinished")
                && retry.stderr.contains("at step 'onboarding'"), "\(retry.stderr)")
        // A flow that never ran here is a typo until the operator says otherwise.
        let typo = try await hopctl(["start", "--flow", "startpu", "--subject", "user-9"], in: folder)
        #expect(typo.status == 1 && typo.stderr.contains("the flows that ran here: startup"), "\(typo.stderr)")
        let noVersion = try await hopctl(["start", "--flow", "other", "--subject", "user-9", "--force"], in: folder)
        #expect(noVersion.status == 1 && noVersion.stderr.contains("--flow-version"), "\(noVersion.stderr)")
        let badVersion = try await hopctl(["start", "--flow", "startup", "--flow-version", "1\u{7}"], in: folder)
        #expect(badVersion.status == 64, "\(badVersion.stderr)")
        #expect(try await store.runs().count == runsBefore)
        #expect(try await store.allRuns(flow: "startup", subject: "user-9").count == 1)

        // With --force and a version, the first run of a flow is recorded, for a daemon that has it.
        let forced = try await hopctl(
            ["start", "--flow", "other", "--subject", "user-9", "--force", "--flow-version", "3"], in: folder)
        #expect(forced.status == 0, "\(forced.stderr)")
        let other = try #require(try await store.latestRun(flow: "other", subject: "user-9"))
        #expect(other.status == .running && other.flowVersion == "3" && other.owner == nil)

        // Once the run finished, the next start is a new run; this one skips what the first used.
        let unhop = try await hopctl(
            ["unhop", "--flow", "startup", "--subject", "user-9", "--step", "onboarding"], in: folder)
        #expect(unhop.status == 0, "\(unhop.stderr)")
        let login = try await hopctl(["session", "login", "alice", "--subject", "user-9"], in: folder)
        #expect(login.status == 0, "\(login.stderr)")
        try await waitUntil("the first run completes") {
            try await store.run(id: runID)?.status == .completed
        }
        let again = try await hopctl(["start", "--flow", "startup", "--subject", "user-9"], in: folder)
        #expect(again.status == 0 && again.stdout.contains("started run"), "\(again.stderr)")
        try await waitUntil("the daemon runs the second run to its end") {
            try await store.latestRun(flow: "startup", subject: "user-9")?.status == .completed
        }
        let second = try #require(try await store.latestRun(flow: "startup", subject: "user-9"))
        #expect(second.id != runID)
        let steps = try await store.history(runID: second.id).filter { $0.kind == .hop }.compactMap(\.step)
        #expect(steps == ["splash", "main"], "\(steps)")

        daemon.closeInput()
        #expect(try await daemon.waitForExit() == 0)
    }

    /// The flow version is `--flow-version`: the help shows one `--version`, hopctl's own. The
    /// first spelling, `--version V`, is still taken; both with different versions are refused.
    @Test func theFlowVersionIsFlowVersionAndTheFirstSpellingStillWorks() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for command in ["start", "fork"] {
            let help = try await hopctl([command, "--help"], in: folder)
            #expect(help.stdout.contains("--flow-version <v>"), "\(help.stdout)")
            let versionLines = help.stdout.split(separator: "\n").filter { $0.contains("--version") }
            #expect(versionLines.count == 1 && versionLines[0].contains("Show the version"), "\(help.stdout)")
        }
        let former = try await hopctl(["start", "--flow", "startup", "--subject", "s1", "--version", "7"], in: folder)
        #expect(former.status == 0 && former.stdout.contains("(version 7)"), "\(former.stdout)\(former.stderr)")
        let both = try await hopctl(
            ["start", "--flow", "startup", "--subject", "s2", "--version", "7", "--flow-version", "8"], in: folder)
        #expect(both.status == 64 && both.stderr.contains("former name of --flow-version"), "\(both.stderr)")
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.latestRun(flow: "startup", subject: "s1")?.flowVersion == "7")
        #expect(try await store.latestRun(flow: "startup", subject: "s2") == nil)
    }
}
