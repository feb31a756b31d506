import Foundation
import HopStore
import HopTestSupport
import Testing

/// A session that expires is a session removed: everywhere, at its expiry, and durably.
@Suite struct SessionExpiryTests {
    @Test func anExpiryUnderOneSecondZeroOrNegativeIsAUsageErrorAndStoresNothing() async throws {
        let folder = try TemporaryDirectory()
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        for expiry in ["0.0001s", "0.4s", "0", "0s", "-5d", "-1", "nan", "soon", "101000d"] {
            let result = try await hopctl(["session", "login", "bob", "--expires-in", expiry], in: folder)
            #expect(result.status == 64, "--expires-in \(expiry): \(result.stdout)\(result.stderr)")
            #expect(!result.stderr.contains("Missing value"), "--expires-in \(expiry): \(result.stderr)")
        }
        #expect(try await HopStore.open(path: folder.database).session(subject: "default") == nil)
        let lasting = try await hopctl(["session", "login", "bob"], in: folder)
        #expect(lasting.stdout.contains("never expires"), "\(lasting.stdout)")
        let timed = try await hopctl(["session", "login", "bob", "--expires-in", "1s"], in: folder)
        #expect(timed.status == 0 && timed.stdout.contains("expires in 1s"), "\(timed.stdout)")
        // What was asked, not the largest unit of it.
        let ninety = try await hopctl(["session", "login", "bob", "--expires-in", "90m"], in: folder)
        #expect(ninety.status == 0 && ninety.stdout.contains("expires in 1h30m"), "\(ninety.stdout)")
        let shown = try await hopctl(["session", "show"], in: folder)
        #expect(shown.stdout.contains("in 1h30m") || shown.stdout.contains("in 1h29m"), "\(shown.stdout)")
    }

    @Test func aTokenIsNeverEchoedAndBadTokensAreUsageErrors() async throws {
        let folder = try TemporaryDirectory()
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        let argument = try await hopctl(["session", "login", "alice", "s3cr3t-token"], in: folder)
        #expect(argument.status == 64 && argument.stderr.contains("--token-stdin"), "\(argument.stderr)")
        #expect(!argument.stderr.contains("s3cr3t") && !argument.stdout.contains("s3cr3t"))

        let empty = try await hopctl(["session", "login", "alice", "--token-stdin"], in: folder, stdin: "\n")
        #expect(empty.status == 64 && empty.stderr.contains("read no token"), "\(empty.stderr)")
        #expect(!empty.stderr.contains("SUBCOMMANDS"), "the whole usage was printed: \(empty.stderr)")

        let huge = try await hopctl(
            ["session", "login", "alice", "--token-stdin"], in: folder, stdin: String(repeating: "k", count: 5000))
        #expect(huge.status == 64 && huge.stderr.contains("at most 4096 bytes"), "\(huge.stderr)")
        #expect(!huge.stderr.contains("kkkk"))

        // Raw bytes through a shell: ff fe fd is no UTF-8, and must not be stored repaired.
        let hopctl = builtProduct("hopctl")
        let raw = try await run(
            "/bin/sh",
            [
                "-c",
                #"printf '\377\376\375' | "\#(hopctl)" session login alice --token-stdin --db "\#(folder.database)""#,
            ], in: folder)
        #expect(raw.status == 64 && raw.stderr.contains("not valid UTF-8"), "\(raw.stderr)")
        #expect(
            try await HopStore.open(path: folder.database).session(subject: "default") == nil,
            "a refusal stores nothing")
    }

    @Test func anExpiringSessionReRoutesAStepThatLastsWhileASessionIsStoredAsALogoutDoes() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.markUsed(subject: "default", feature: "onboarding")
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute"], directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("parked login")
        // Read back at once: a look after the daemon parked at main could come after the expiry
        // on a machine loaded by the whole suite, and find no session.
        #expect(try await hopctl(["session", "login", "alice", "--expires-in", "4s"], in: folder).status == 0)
        let expiry = try #require(try await store.session(subject: "default")?.expiresAt)
        try await daemon.waitForOutput("parked main")

        try await waitUntil("the daemon parks at login again once the session expired") {
            daemon.stdout.components(separatedBy: "parked login").count == 3
        }
        let history = try await store.history(runID: 1)
        let reroute = try #require(history.last { $0.kind == .reroute })
        #expect(reroute.at >= expiry.addingTimeInterval(-0.01), "re-routed before the expiry")
        #expect(reroute.value == #"{"reason":"session-expired"}"#)
        #expect(
            history.suffix(4).map { "\($0.kind.rawValue) \($0.step ?? "")" } == [
                "hop main", "reroute main", "decision session", "hop login",
            ])
        #expect(
            history.last { $0.kind == .decision && $0.step == "session" }?.value == "null", "the flow saw no session")
        let show = try await hopctl(["session", "show"], in: folder)
        #expect(show.stdout.contains("no session stored"), "\(show.stdout)")
    }

    @Test func aSessionThatExpiredWhileNoDaemonRanReRoutesTheRunWhenTheDaemonStarts() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.markUsed(subject: "default", feature: "onboarding")
        // The daemon kills itself once it has parked at main: a kill sent by the test could come
        // after the expiry on a machine loaded by the whole suite, and the daemon would see it.
        let first = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute"],
            environment: ["HOP_TEST_KILL_AT": "after:hop:main"], directory: folder)
        try await first.waitForOutput("parked login")
        #expect(try await hopctl(["session", "login", "alice", "--expires-in", "3s"], in: folder).status == 0)
        try await first.waitForExit()
        #expect(first.stdout.contains("point after:hop:main"), "\(first.stdout)")
        let expiry = try #require(try await store.history(runID: 1).last).at.addingTimeInterval(3)
        try await waitUntil("the session has expired") {
            Date() > expiry.addingTimeInterval(0.2)
        }
        #expect(try await store.run(id: 1)?.currentStep == "main", "nothing moved the run while no daemon ran")

        let second = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute"], directory: folder)
        defer { second.kill() }
        try await second.waitForOutput("parked login")
        let kinds = try await store.history(runID: 1).filter { $0.kind != .takeover }.map {
            "\($0.kind.rawValue) \($0.step ?? "")"
        }
        #expect(kinds.suffix(4) == ["hop main", "reroute main", "decision session", "hop login"], "\(kinds)")
    }

    @Test func aSessionAlreadyExpiredIsRefusedByTheStoreAndWakesNoLoginStep() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let run = try await store.startRun(flow: "startup", subject: "default", version: "1").run
        try await store.recordHop(runID: run.id, step: "login", parks: true, wakeOn: .sessionStored)
        let refused = await #expect(throws: HopError.self) {
            try await store.storeSession(
                subject: "default", userID: "bob", token: "t", expiresAt: Date().addingTimeInterval(-1))
        }
        #expect(refused?.code == .invalidInput)
        #expect(try await store.run(id: run.id)?.status == .parked, "an expired session woke the login step")
        #expect(try await store.session(subject: "default") == nil)
    }
}
