import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging
import Testing

/// Hostile names, malformed outputs and damaged files: each is a clear error or is stored
/// verbatim, nothing crashes and nothing stored is lost.
@Suite struct HostileInputTests {
    @Test func namesThatLookLikeSQLOrScriptsAreStoredVerbatim() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let names = [
            "'", "\"", "'; DROP TABLE runs; --", "Robert'); DELETE FROM history;--", "%_*?", "名前", "👩‍💻", "\\x00",
        ]
        for name in names {
            let run = try await store.startRun(flow: name, subject: name, version: name).run
            try await store.recordDecision(runID: run.id, name: name, value: #"{"v":1}"#)
            #expect(try await store.latestRun(flow: name, subject: name)?.id == run.id, "\(name)")
            #expect(try await store.history(runID: run.id).first?.step == name)
        }
        #expect(try await store.runs().count == names.count)
        // A name that could pose as another in a table is refused, not stored.
        await #expect(throws: HopError.self) {
            try await store.startRun(flow: "\u{202E}evil", subject: "s", version: "1")
        }
        #expect(try await store.runs().count == names.count)
        #expect(try await store.integrityCheck() == ["ok"])
    }

    @Test func malformedOutputsAreRefusedAndChangeNothing() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let parked = try await store.startRun(flow: "startup", subject: "default", version: "1").run
        let hop = try await store.recordHop(runID: parked.id, step: "onboarding", parks: true)
        for output in ["{", "[1,", "nul", "{\"a\":}", "'single'", "\u{0}", String(repeating: "[", count: 5000)] {
            await #expect(throws: HopError.self, "output \(output.prefix(20).debugDescription)") {
                try await store.recordUnhop(runID: parked.id, token: try #require(hop.token), output: output)
            }
            await #expect(throws: HopError.self) {
                try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding", output: output)
            }
        }
        #expect(try await store.history(runID: parked.id).map(\.kind) == [.hop])
        let folderJSON = try await run(
            "hopctl",
            ["unhop", "--flow", "startup", "--step", "onboarding", "--output", "{\"a\":", "--db", folder.database],
            in: folder)
        #expect(folderJSON.status == 64 && folderJSON.stderr.contains("JSON"), "\(folderJSON.stderr)")
        #expect(try await store.history(runID: parked.id).map(\.kind) == [.hop])
    }

    @Test func hopctlTakesRawBytesInvalidUTF8AndHugeArgumentsWithoutCrashing() async throws {
        let folder = try TemporaryDirectory()
        let daemon = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
        #expect(daemon.status == 0)
        let hopctl = builtProduct("hopctl")
        let db = folder.database
        // Through a shell, so that the arguments are raw bytes, not Swift strings.
        let commands = [
            #"status --flow "$(printf '\377\376')""#,
            #"history --flow "$(printf 'start\377up')""#,
            #"session login "$(printf '\300\200')""#,
            #"status --subject "$(head -c 20000 /dev/zero | tr '\0' 'x')""#,
            #"history --flow "'; DROP TABLE runs; --""#,
            #"reset-first-use "$(printf 'a\001b')""#,
            #"unhop --flow startup --step onboarding --output "$(printf '{\"a\":\"\377\"}')""#,
        ]
        for command in commands {
            let result = try await run("/bin/sh", ["-c", "\"\(hopctl)\" \(command) --db \"\(db)\""], in: folder)
            #expect([0, 1, 64].contains(result.status), "hopctl \(command): exit \(result.status) \(result.stderr)")
            #expect(
                !result.stderr.contains("Fatal error") && !result.stderr.contains("Crash"),
                "\(command): \(result.stderr)")
            if result.status != 0 { #expect(!result.stderr.isEmpty, "\(command) failed silently") }
        }
        let store = try await HopStore.open(path: db)
        #expect(try await store.integrityCheck() == ["ok"])
        #expect(try await store.latestRun(flow: "startup", subject: "default")?.status == .completed)
    }

    @Test func aTruncatedWALKeepsEveryWholeCommitAndTheRunResumes() async throws {
        let folder = try TemporaryDirectory()
        let killed = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database], environment: ["HOP_TEST_KILL_AT": "after:unhop:login"],
            directory: folder)
        try await killed.waitForExit()
        #expect(killed.wasSignalled)
        let wal = folder.database + "-wal"
        let size = try #require(try FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int)
        #expect(size > 4096)
        // Cut the log in the middle of its last frame, as a torn write would.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: wal))
        try handle.truncate(atOffset: UInt64(size - 1000))
        try handle.close()

        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.integrityCheck() == ["ok"])
        let latest = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        let kept = try await store.history(runID: latest.id).map { "\($0.kind.rawValue) \($0.step ?? "-")" }
        let full = [
            "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding", "unhop onboarding",
            "effect markUsed(onboarding)", "decision session", "hop login", "unhop login",
        ]
        #expect(!kept.isEmpty && Array(full.prefix(kept.count)) == kept, "\(kept)")
        #expect(kept.count < full.count, "the torn commit was kept")

        let resumed = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
        #expect(
            resumed.status == 0 && resumed.stdout.contains("settled completed"), "\(resumed.stdout)\(resumed.stderr)")
    }

    @Test func aDatabaseDamagedInTheMiddleGivesClearErrorsNotCrashes() async throws {
        let folder = try TemporaryDirectory()
        let daemon = try await run("hop-test-daemon", ["--db", folder.database], in: folder)
        #expect(daemon.status == 0)
        // Every page in the file itself: the daemon exits without closing its connections, and
        // what it wrote may still be in the write-ahead log only (the file was 4,096 bytes once).
        try await HopStore.open(path: folder.database).checkpoint()
        var bytes = try Data(contentsOf: URL(fileURLWithPath: folder.database))
        #expect(bytes.count > 4 * 4096)
        // Keep the header page, scramble the rest.
        for index in 4096..<bytes.count { bytes[index] = UInt8(truncatingIfNeeded: index &* 31 &+ 7) }
        try bytes.write(to: URL(fileURLWithPath: folder.database))

        for arguments in [
            ["status"], ["history", "--flow", "startup"], ["session", "show"],
            ["unhop", "--flow", "startup", "--step", "onboarding"], ["migrate"],
        ] {
            let result = try await run("hopctl", arguments + ["--db", folder.database], in: folder)
            #expect(result.status == 1, "\(arguments): exit \(result.status) \(result.stdout)\(result.stderr)")
            #expect(result.stderr.contains(folder.database), "\(arguments): \(result.stderr)")
        }
        do {
            let store = try await HopStore.open(path: folder.database)
            #expect(try await store.integrityCheck() != ["ok"])
        } catch let error as HopError {
            #expect(error.path == folder.database && error.isDatabaseFailure, "\(error)")
        }
    }

    /// Found by script/fuzz: an expiry of 10^20 seconds trapped converting to milliseconds.
    @Test func extremeDatesAndDurationsNeitherTrapNorCorrupt() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        for expiry in [Date(timeIntervalSince1970: 1e300), .distantFuture] {
            _ = try await store.storeSession(subject: "s", userID: "alice", token: "t", expiresAt: expiry)
        }
        for expiry in [Date(timeIntervalSince1970: -1e300), .distantPast] {
            let refused = await #expect(throws: HopError.self) {
                try await store.storeSession(subject: "s", userID: "alice", token: "t", expiresAt: expiry)
            }
            #expect(refused?.code == .invalidInput)
        }
        let engine = HopEngine(store: store, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(
            Flow("far", version: "1") { flow in
                try await flow.hop(to: "quick", timeout: .seconds(Int64.max / 2))
                try await flow.sleep(for: .seconds(-5))
            })
        engine.register(step: "quick") { _ in }
        let started = try await engine.start("far")
        #expect(try await engine.settled(runID: started.id)?.status == .completed)
        for duration in ["99999999999999999999", "1e300", "1e300d", "inf", "nan", "-1s", "0"] {
            let result = try await run(
                "hopctl", ["session", "login", "bob", "--expires-in", duration, "--db", folder.database], in: folder)
            #expect(
                result.status == 64 && result.stderr.contains("--expires-in"),
                "\(duration): \(result.status) \(result.stderr.prefix(300))")
        }
        #expect(try await store.integrityCheck() == ["ok"])
    }
}
