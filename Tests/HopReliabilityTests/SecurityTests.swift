import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryLogging
import Logging
import Testing

/// Session tokens stay secret, identifiers are checked at the boundary, and values never
/// become SQL text.
@Suite struct SecurityTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func aSessionTokenNeverReachesLogsErrorsOrHopctlOutput() async throws {
        let folder = try TemporaryDirectory()
        let secret = "tok-\(UUID().uuidString)"
        let logs = InMemoryLogHandler.keepingEverything()
        let store = try await HopStore.open(path: folder.database, logger: logs.logger(label: "store"))
        let engine = HopEngine(store: store, logger: logs.logger(label: "engine"))
        engine.register(
            Flow("startup", version: "1") { flow in
                if try await flow.session() == nil { try await flow.hop(to: "login") }
                try await flow.hop(to: "main")
            })
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        engine.register(step: "main") { _ in }
        let started = try await engine.start("startup")
        #expect(try await engine.settled(runID: started.id)?.status == .parked)
        try await engine.storeSession(subject: "default", userID: "alice", token: secret)
        #expect(try await engine.settled(runID: started.id)?.status == .completed)

        // Refused calls carrying the token: their errors do not repeat it.
        for (user, subject) in [
            ("bad\u{1}user", "default"), ("alice", String(repeating: "s", count: 5000)), ("", "default"),
        ] {
            do {
                try await engine.storeSession(subject: subject, userID: user, token: secret)
                Issue.record("a session with user \(user.debugDescription) was stored")
            } catch {
                #expect(!"\(error)".contains(secret))
                #expect(!String(reflecting: error).contains(secret))
            }
        }
        _ = try await engine.deleteSession(subject: "default")
        try await engine.storeSession(subject: "default", userID: "alice", token: secret)

        #expect(!logs.texts().contains { $0.contains(secret) }, "a log line holds the token")
        for arguments in [
            ["session", "show"], ["session", "show", "--json"], ["status"], ["status", "--json"],
            ["history", "--flow", "startup"], ["history", "--flow", "startup", "--json"], ["first-use", "list"],
        ] {
            let result = try await run("hopctl", arguments + ["--db", folder.database], in: folder)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
            #expect(
                !result.stdout.contains(secret) && !result.stderr.contains(secret),
                "hopctl \(arguments) printed the token")
        }
        let revealed = try await run(
            "hopctl", ["session", "show", "--reveal-token", "--db", folder.database], in: folder)
        #expect(revealed.stdout.contains(secret), "--reveal-token shows it when asked")
    }

    @Test func identifiersAreCheckedAtTheBoundaryAndRefusalsChangeNothing() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let bad = [
            "", String(repeating: "x", count: Identifier.maximumLength + 1), String(repeating: "ü", count: 200),
            "nul\u{0}here", "tab\there", "del\u{7F}", "esc\u{1B}[2J",
        ]
        for (index, value) in bad.enumerated() {
            for attempt in 0..<4 {
                do {
                    switch attempt {
                    case 0: _ = try await store.startRun(flow: value, subject: "s", version: "1")
                    case 1: _ = try await store.startRun(flow: "f", subject: value, version: "1")
                    case 2: _ = try await store.storeSession(subject: "s", userID: value, token: "t")
                    default: _ = try await store.resetFirstUse(subject: value, features: ["onboarding"])
                    }
                    Issue.record("bad value \(index) was accepted in call \(attempt)")
                } catch let error as HopError {
                    #expect(error.code == .invalidInput, "value \(index), call \(attempt): \(error)")
                    #expect(error.description.contains("not a valid identifier"), "\(error)")
                }
            }
        }
        #expect(try await store.runs().isEmpty)
        #expect(try await store.session(subject: "s") == nil)
    }

    @Test func noSQLIsBuiltByInterpolatingValues() throws {
        // An interpolation inside SQL text may only splice in one of these constants; every
        // value goes through a bound parameter (?1, ?2, …).
        let allowed: Set<String> = [
            "RunRecord.columns", "RunHead.columns", "HistoryEntry.columns", "filter",
            #"durability == .full ? "FULL" : "NORMAL""#,
            "Self.walSizeLimit",  // the write-ahead log's size limit, a constant (Connection)
            "claimable",  // a constant condition around a constant selection (HopStore+Ownership)
            "selection",  // the constant condition that picks the runs a claim takes (HopStore+Ownership)
            "flowsSQL", "flowsTable",  // the constant table of flow names (HopStore+RunQueries)
            // Statuses and kinds as literals of the code's own enums (a partial index needs them in the text).
            "RunStatus.running.sql", "RunStatus.parked.sql", "RunStatus.unfinishedSQL", "RunStatus.running.condition",
            "RunStatus.parked.condition", "HistoryKind.hop.sql",
            "HistoryKind.takeover.sql", "HistoryKind.stepEndsSQL", "HistoryKind.replayedSQL", "HistoryKind.patch.sql",
            // PostgreSQL's store: its column lists and constant lists, and constant clauses.
            "RunRecord.pgColumns", "RunRecord.pgQualifiedColumns", "HistoryEntry.pgColumns", "RunStatus.pgUnfinished",
            "HistoryKind.pgStepEnds", "HistoryKind.pgReplayed", #"skipLocked ? " SKIP LOCKED" : """#,
            #"locking ? " FOR UPDATE" : """#,
            "PostgresStore.serverNow",  // the server's clock, by which leases are measured
            "PostgresStore.serverAge",  // how long ago the server started
            "Self.runsTableNow", "PostgresStore.runsTableNow",  // the object id of the `runs` table
            "AdvisoryLock.heldOnKey",  // the constant condition that a liveness lock on `k.key` is held
            #"PostgresStore.leaseRunOut(grace: "$4")"#,  // a lease's end, over a placeholder only
            #"RunRecord.pgColumnsJudgingLeases(grace: "$1")"#,  // the run columns, a lease's end over a placeholder
            "runColumns",  // a backend's column list of its run records (LatestRuns)
            // A file's condition on a lease, over placeholders only (HopStore+Ownership).
            #"leaseOver(wall: "?2", boot: "?5", uptime: "?6")"#,
        ]
        let sql = try Regex(#"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|CREATE|ALTER|DROP|VALUES|WHERE)\b"#)
        var checked = 0
        for folder in [
            "Sources/HopStore", "Sources/HopEngine", "Sources/HopPostgres", "Sources/HopctlCommands", "Sources/hopctl",
        ] {
            let root = Self.packageRoot.appendingPathComponent(folder)
            let files =
                FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil)?
                .compactMap { $0 as? URL }.filter { $0.pathExtension == "swift" } ?? []
            for file in files {
                let text = try String(contentsOf: file, encoding: .utf8)
                for literal in Self.stringLiterals(in: text) where literal.contains(sql) {
                    checked += 1
                    for interpolation in Self.interpolations(in: literal) {
                        #expect(
                            allowed.contains(interpolation),
                            "\(file.lastPathComponent): SQL built with \\(\(interpolation)): \(literal.prefix(120))")
                    }
                }
            }
        }
        #expect(checked > 40, "the scan found only \(checked) SQL strings")
        // The scanner itself sees a value spliced into SQL.
        let sample = #"let sql = "SELECT * FROM runs WHERE subject = '\(subject)' AND id = \(id(of: run))""#
        #expect(Self.stringLiterals(in: sample).flatMap(Self.interpolations(in:)) == ["subject", "id(of: run)"])
    }

    /// The string literals of Swift source, single-line and multi-line.
    static func stringLiterals(in text: String) -> [String] {
        var literals: [String] = []
        var index = text.startIndex
        while let open = text[index...].firstIndex(of: "\"") {
            if text[open...].hasPrefix("\"\"\"") {
                let start = text.index(open, offsetBy: 3)
                guard let close = text[start...].range(of: "\"\"\"") else { break }
                literals.append(String(text[start..<close.lowerBound]))
                index = close.upperBound
            } else {
                var cursor = text.index(after: open)
                var depth = 0
                while cursor < text.endIndex {
                    let character = text[cursor]
                    if character == "\\", text.index(after: cursor) < text.endIndex,
                        text[text.index(after: cursor)] == "("
                    {
                        depth += 1
                        cursor = text.index(cursor, offsetBy: 2)
                        continue
                    }
                    if character == "\\" {
                        cursor = text.index(cursor, offsetBy: 2, limitedBy: text.endIndex) ?? text.endIndex
                        continue
                    }
                    if depth > 0 {
                        if character == "(" { depth += 1 } else if character == ")" { depth -= 1 }
                    } else if character == "\"" || character == "\n" {
                        break
                    }
                    cursor = text.index(after: cursor)
                }
                literals.append(String(text[text.index(after: open)..<min(cursor, text.endIndex)]))
                index = cursor < text.endIndex ? text.index(after: cursor) : text.endIndex
            }
        }
        return literals
    }

    /// The expressions interpolated in a literal with `\(…)`.
    static func interpolations(in literal: String) -> [String] {
        var found: [String] = []
        var rest = literal[...]
        while let start = rest.range(of: "\\(") {
            var depth = 1
            var cursor = start.upperBound
            while cursor < rest.endIndex, depth > 0 {
                if rest[cursor] == "(" { depth += 1 } else if rest[cursor] == ")" { depth -= 1 }
                cursor = rest.index(after: cursor)
            }
            found.append(String(rest[start.upperBound..<rest.index(before: cursor)]))
            rest = rest[cursor...]
        }
        return found
    }
}
