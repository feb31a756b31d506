import Foundation
import HopStore
import HopTestSupport
import Testing

@Suite struct ReadCommandTests {
    @Test func migrateCreatesTheDatabaseAndPrintsTheSchemaVersion() async throws {
        let folder = try TemporaryDirectory()
        let first = try await hopctl(["migrate"], in: folder)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.hasPrefix("schema version \(Migration.latestVersion) ("))
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        #expect(FileManager.default.fileExists(atPath: folder.database))
    }

    @Test func theDatabaseOptionsMayAlsoComeBeforeTheCommand() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        // JSON: absolute times, the same whenever the command runs.
        let after = try await run(
            "hopctl", ["history", "--flow", "startup", "--json", "--db", folder.database], in: folder)
        for arguments in [
            ["--db", folder.database, "history", "--flow", "startup", "--json"],
            ["--db=\(folder.database)", "--busy-timeout", "100", "history", "--flow", "startup", "--json"],
        ] {
            let before = try await run("hopctl", arguments, in: folder)
            #expect(before.status == 0, "\(arguments): \(before.stderr)")
            #expect(before.stdout == after.stdout)
        }
        let login = try await run(
            "hopctl", ["--db", folder.database, "session", "login", "bob", "--subject", "kiosk"], in: folder)
        #expect(login.status == 0, "\(login.stderr)")
        #expect(try await HopStore.open(path: folder.database).session(subject: "kiosk")?.userID == "bob")
    }

    @Test func statusListsOneLinePerRunAsATableAndAsJSON() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let table = try await hopctl(["status"], in: folder)
        #expect(table.status == 0)
        let lines = table.stdout.split(separator: "\n")
        #expect(lines.count == 2)
        #expect(
            lines[0].split(separator: " ", omittingEmptySubsequences: true) == [
                "FLOW", "SUBJECT", "RUN", "STATUS", "STEP", "OWNER", "CHANGED",
            ])
        #expect(lines[1].contains("startup") && lines[1].contains("completed") && lines[1].contains("ago"))

        let json = try #require(
            try await hopctlJSON(["status", "--flow", "startup", "--subject", "default"], in: folder)
                as? [[String: Any]])
        #expect(json.count == 1)
        #expect(
            Set(json[0].keys) == [
                "run", "flow", "subject", "status", "current_step", "current_step_entry", "flow_version", "created_at",
                "updated_at", "owner", "lease_live", "diverged",
            ])
        #expect(json[0]["current_step_entry"] is NSNull)
        #expect(json[0]["status"] as? String == "completed" && json[0]["flow"] as? String == "startup")
        #expect(try await hopctlJSON(["status", "--subject", "nobody"], in: folder) as? [Any] != nil)
    }

    /// `hopctl status --status S` on more flows and subjects than one listing shows: every run
    /// with that status, wherever its subject sorts (it once filtered the first 1,000 subjects'
    /// runs, so a parked run of the 1,003rd was not listed), and a note on standard error when a
    /// listing stops at its limit (it once stopped at 1,000 lines without a word).
    @Test func statusFindsEveryRunWithAStatusAndSaysWhenAListingStops() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database, options: .init(durability: .normal))
        let subjects = (0..<1_005).map { "device-" + String(repeating: "0", count: 4 - "\($0)".count) + "\($0)" }
        for (index, subject) in subjects.enumerated() {
            let (run, _) = try await store.startRun(flow: "startup", subject: subject, version: "1")
            switch index {
            case 1_002: _ = try await store.recordHop(runID: run.id, step: "login", parks: true)
            case 1_003: break  // running
            case 1_004: try await store.divergeRun(runID: run.id, step: "login", message: "changed")
            default: _ = try await store.record([.complete], runID: run.id, owner: nil, durability: .now)
            }
        }
        for (status, subject) in [("parked", "device-1002"), ("running", "device-1003"), ("diverged", "device-1004")] {
            let listed = try #require(
                try await hopctlJSON(["status", "--status", status], in: folder) as? [[String: Any]])
            #expect(listed.map { $0["subject"] as? String } == [subject], "--status \(status)")
        }
        // 1,002 completed runs: the first 1,000, then a note that more were left out.
        let completed = try await hopctl(["status", "--status", "completed", "--json"], in: folder)
        let rows = try #require(
            try JSONSerialization.jsonObject(with: Data(completed.stdout.utf8)) as? [[String: Any]])
        #expect(rows.count == 1_000 && rows.last?["subject"] as? String == "device-0999")
        #expect(completed.stderr.contains("first 1000"), "\(completed.stderr)")
        let table = try await hopctl(["status"], in: folder)
        #expect(table.status == 0 && table.stdout.split(separator: "\n").count == 1_001)
        #expect(table.stderr.contains("first 1000") && table.stderr.contains("--limit"), "\(table.stderr)")
        // --limit: more lines, or fewer; no note when nothing was left out.
        let all = try await hopctl(["status", "--limit", "2000"], in: folder)
        #expect(all.stdout.split(separator: "\n").count == 1_006 && all.stderr.isEmpty, "\(all.stderr)")
        let two = try await hopctl(["status", "--limit", "2", "--flow", "startup"], in: folder)
        #expect(two.stdout.split(separator: "\n").count == 3 && two.stderr.contains("first 2"), "\(two.stderr)")
        let bad = try await hopctl(["status", "--limit", "0"], in: folder)
        #expect(bad.status != 0 && bad.stderr.contains("--limit"), "\(bad.stderr)")
        // Every run's history, read a page of runs at a time (1,000): all 1,005, in order.
        let histories = try #require(
            try await hopctlJSON(["history", "--flow", "startup", "--all-runs"], in: folder) as? [[String: Any]])
        let ids = histories.compactMap { ($0["run"] as? [String: Any])?["run"] as? Int }
        #expect(ids == Array(1...1_005), "\(ids.count) runs")
        // (The running run has recorded nothing yet.)
        #expect(histories.filter { ($0["entries"] as? [Any])?.isEmpty == false }.count == 1_004)
        let tables = try await hopctl(["history", "--flow", "startup", "--all-runs"], in: folder)
        #expect(tables.status == 0 && tables.stdout.contains("device-1004") && tables.stdout.contains("device-0000"))
    }

    @Test func statusSaysWhichVersionARunNoEngineHoldsWaitsFor() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        _ = try await store.startRun(flow: "startup", subject: "kiosk-1", version: "1")
        let result = try await hopctl(["status"], in: folder)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("- (waits for an engine with version 1)"), "\(result.stdout)")
    }

    @Test func historyPrintsTheRunsEntriesInOrder() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let json = try #require(try await hopctlJSON(["history", "--flow", "startup"], in: folder) as? [String: Any])
        let entries = try #require(json["entries"] as? [[String: Any]])
        #expect(entries.compactMap { $0["seq"] as? Int } == Array(1...12))
        #expect(entries.first?["kind"] as? String == "hop" && entries.first?["step"] as? String == "splash")
        #expect(entries.last?["kind"] as? String == "complete")
        #expect(Set(entries[0].keys) == ["seq", "kind", "step", "value", "at"])

        let limited = try #require(
            try await hopctlJSON(["history", "--flow", "startup", "--limit", "2"], in: folder) as? [String: Any])
        #expect((limited["entries"] as? [[String: Any]])?.compactMap { $0["seq"] as? Int } == [11, 12])
        let byID = try await hopctl(["history", "--flow", "startup", "--run", "1"], in: folder)
        #expect(byID.status == 0 && byID.stdout.contains("run 1 of startup for default: completed"))
        let table = try await hopctl(["history", "--flow", "startup"], in: folder)
        #expect(table.stdout.contains("markUsed(onboarding)"))
    }

    @Test func firstUseListAndSessionShowRedactTheTokenUnlessAsked() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let flags = try #require(try await hopctlJSON(["first-use", "list"], in: folder) as? [[String: Any]])
        #expect(flags.map { $0["feature"] as? String } == ["onboarding"])

        let shown = try await hopctl(["session", "show"], in: folder)
        #expect(shown.status == 0 && shown.stdout.contains("alice"))
        #expect(!shown.stdout.contains("token-of-alice"))
        let json = try #require(try await hopctlJSON(["session", "show"], in: folder) as? [String: Any])
        #expect(json["user_id"] as? String == "alice" && json["token_redacted"] as? Bool == true)
        #expect(!(json["token"] as? String ?? "").contains("token-of-alice"))
        let revealed = try await hopctl(["session", "show", "--reveal-token"], in: folder)
        #expect(revealed.stdout.contains("token-of-alice"))
    }

    @Test func graphDrawsTheObservedHopsWithCounts() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        try await completedStartup(folder)
        let mermaid = try await hopctl(["graph", "--flow", "startup"], in: folder)
        #expect(mermaid.status == 0)
        #expect(mermaid.stdout.hasPrefix("flowchart LR"))
        #expect(mermaid.stdout.contains("start -->|2| n1") && mermaid.stdout.contains("n1[\"splash\"]"))
        let dot = try await hopctl(["graph", "--flow", "startup", "--format", "dot"], in: folder)
        #expect(dot.stdout.contains("\"splash\" -> \"main\" [label=\"1\"];"))
        #expect(dot.stdout.contains("\"splash\" -> \"onboarding\" [label=\"1\"];"))
        let edges = try #require(try await hopctlJSON(["graph", "--flow", "startup"], in: folder) as? [[String: Any]])
        #expect(edges.count == 5)
    }

    @Test func humanOutputCarriesNoControlCharacters() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.recordHop(runID: run.id, step: "splash")
        try await store.recordError(runID: run.id, step: "splash", message: "bad \u{1B}[31mred\u{07} text", final: true)
        let result = try await hopctl(["history", "--flow", "startup"], in: folder)
        #expect(result.status == 0)
        #expect(!result.stdout.unicodeScalars.contains { $0.properties.generalCategory == .control && $0 != "\n" })
        #expect(result.stdout.contains("\\u{1b}[31mred"))
    }

    @Test func everyCommandHasHelpAndCompletionScriptsAreGenerated() async throws {
        let folder = try TemporaryDirectory()
        for command in [
            [], ["migrate"], ["status"], ["history"], ["unhop"], ["cancel"], ["restart"], ["reset-first-use"],
            ["first-use", "list"], ["start"], ["patches"], ["fork"], ["backup"],
            ["session", "login"], ["session", "logout"], ["session", "show"], ["graph"],
        ] {
            let result = try await run("hopctl", command + ["--help"], in: folder)
            #expect(result.status == 0, "\(command)")
            #expect(result.stdout.contains("USAGE: hopctl"), "\(command)")
        }
        let completion = try await run("hopctl", ["--generate-completion-script", "bash"], in: folder)
        #expect(completion.status == 0 && completion.stdout.contains("hopctl"))
    }
}

@Suite struct PortableBinaryTests {
    @Test func aCopiedHopctlCreatesAndUpgradesADatabaseWithoutItsBuildFolder() async throws {
        let folder = try TemporaryDirectory()
        let copy = folder.path("bin/hopctl")
        try FileManager.default.createDirectory(atPath: folder.path("bin"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: builtProduct("hopctl"), toPath: copy)
        let result = try await run(copy, ["migrate", "--db", folder.path("state/hop.sqlite")], in: folder)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.hasPrefix("schema version \(Migration.latestVersion)"))

        // Alone, it cannot reach a server: it says what to install, and changes nothing.
        let server = try await run(
            copy, ["status", "--db", "postgres://hop:hunter2@/hop?host=/nonexistent"], in: folder)
        #expect(server.status == 1 && server.stderr.contains("hopctl-postgres"), "\(server.stderr)")
        #expect(!server.stderr.contains("hunter2"))
    }
}
