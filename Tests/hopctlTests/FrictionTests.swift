import Foundation
import HopStore
import HopTestSupport
import Testing

/// What a Linux admin hits first with hopctl: each was a friction, each has its answer now.
@Suite struct FrictionTests {
    @Test func versionIsPrintedForHopctlAndHopDemo() async throws {
        let folder = try TemporaryDirectory()
        for product in ["hopctl", "hop-demo"] {
            let result = try await run(product, ["--version"], in: folder)
            #expect(
                result.status == 0 && result.stdout == "\(product) \(HopVersion.current)\n",
                "\(result.stdout)\(result.stderr)")
        }
    }

    @Test func negativeNumbersAreOutOfRangeNotMissing() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for arguments in [
            ["history", "--flow", "startup", "--limit", "-1"], ["history", "--flow", "startup", "--run", "-3"],
            ["cancel", "--flow", "startup", "--busy-timeout", "-5"],
            ["session", "login", "bob", "--expires-in", "-5d"],
        ] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 64 && result.stderr.contains("out of range"), "\(arguments): \(result.stderr)")
            #expect(!result.stderr.contains("Missing value"), "\(arguments): \(result.stderr)")
        }
    }

    @Test func aMistypedCommandGetsTheClosestOne() async throws {
        let folder = try TemporaryDirectory()
        for (typed, meant) in [("statuss", "status"), ("histroy", "history"), ("unhp", "unhop"), ("sesion", "session")]
        {
            let result = try await hopctl([typed], in: folder)
            #expect(
                result.status == 64 && result.stderr.contains("did you mean `hopctl \(meant)`"),
                "\(typed): \(result.stderr)")
        }
    }

    @Test func conflictingOptionsAreRefused() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let both = try await hopctl(["graph", "--flow", "startup", "--json", "--format", "dot"], in: folder)
        #expect(both.status == 64 && both.stderr.contains("conflict"), "\(both.stderr)")
        #expect(both.stdout.isEmpty)
        let dot = try await hopctl(["graph", "--flow", "startup", "--format", "dot"], in: folder)
        #expect(dot.status == 0 && dot.stdout.hasPrefix("digraph"), "\(dot.stdout)")
    }

    @Test func statusAndHistoryAgreeOnAFlowThatNeverRan() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for arguments in [
            ["status", "--flow", "nosuch"], ["history", "--flow", "nosuch"], ["status", "--flow", "nosuch", "--json"],
        ] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 1, "\(arguments): \(result.stdout)")
            #expect(
                result.stderr.contains("no run of flow 'nosuch'") && result.stderr.contains("startup"),
                "\(arguments): \(result.stderr)")
        }
        let otherSubject = try await hopctl(["status", "--flow", "startup", "--subject", "nobody"], in: folder)
        #expect(otherSubject.status == 0, "a known flow with no run for a subject is no error: \(otherSubject.stderr)")
    }

    @Test func resettingAFeatureThatWasNeverUsedSaysSoAndListsTheKnownOnes() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let result = try await hopctl(["reset-first-use", "nosuchfeature"], in: folder)
        #expect(result.status == 0)
        #expect(
            result.stdout.contains("no first-use flag was set for default of nosuchfeature")
                && result.stdout.contains("onboarding"), "\(result.stdout)")
        #expect(!result.stdout.contains("is first-use again"), "\(result.stdout)")
        let store = try await HopStore.open(path: folder.database)
        #expect(
            try await store.isFirstUse(subject: "default", feature: "onboarding") == false, "nothing else was reset")
    }

    @Test func readCommandsTakeNoBusyTimeoutAndEmptyJSONIsOneLine() async throws {
        let folder = try TemporaryDirectory()
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        let status = try await hopctl(["status", "--busy-timeout", "100"], in: folder)
        #expect(status.status == 64 && status.stderr.contains("--busy-timeout"), "\(status.stderr)")
        let empty = try await hopctl(["status", "--json"], in: folder)
        #expect(empty.status == 0 && empty.stdout == "[]\n", "\(empty.stdout)")
        let help = try await hopctl(["session", "show", "--help"], in: folder)
        #expect(!help.stdout.contains("Whom the run is for"), "\(help.stdout)")
    }

    @Test func historyJSONHoldsValuesAsJSON() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let json = try #require(try await hopctlJSON(["history", "--flow", "startup"], in: folder) as? [String: Any])
        let entries = try #require(json["entries"] as? [[String: Any]])
        let login = try #require(entries.first { $0["kind"] as? String == "unhop" && $0["step"] as? String == "login" })
        #expect(
            (login["value"] as? [String: Any])?["userID"] as? String == "alice", "\(String(describing: login["value"]))"
        )
        let firstUse = try #require(
            entries.first {
                $0["kind"] as? String == "decision" && ($0["step"] as? String)?.hasPrefix("isFirstUse") == true
            })
        #expect(firstUse["value"] as? Bool == true)
    }
}
