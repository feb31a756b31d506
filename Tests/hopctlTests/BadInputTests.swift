import Foundation
import HopStore
import HopTestSupport
import Testing

@Suite struct BadInputTests {
    @Test func usageErrorsExitWith64AndChangeNothing() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let cases: [[String]] = [
            ["unhop", "--flow", "startup", "--step", "onboarding", "--output", "{not json"],
            ["status", "--flow", String(repeating: "f", count: 10_000)],
            ["history", "--flow", "start\u{1B}up"],
            ["session", "login", "alice", "--expires-in", "soon"],
            ["session", "login", "bad\nuser"],
            ["history", "--flow", "startup", "--limit", "0"],
            ["no-such-command"],
        ]
        for arguments in cases {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 64, "\(arguments.map { $0.prefix(40) }): \(result.stderr)")
            #expect(!result.stderr.isEmpty)
        }
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.session(subject: "default")?.userID == "alice")
    }

    /// A negative number is a value out of range, not a missing value followed by an unknown option.
    @Test func aNegativeNumberIsSaidToBeOutOfRange() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for (arguments, option) in [
            (["prune", "--finished-before", "-1d"], "--finished-before"), (["status", "--limit", "-1"], "--limit"),
            (["history", "--flow", "startup", "--limit", "-2"], "--limit"),
            (["session", "login", "bob", "--expires-in", "-5d"], "--expires-in"),
            (["prune", "--finished-before", "1d", "--keep-last", "-3"], "--keep-last"),
            (["session", "logout", "--busy-timeout", "-1"], "--busy-timeout"),
        ] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 64, "\(arguments)")
            #expect(
                result.stderr.contains("\(option) is out of range") && !result.stderr.contains("Missing value"),
                "\(arguments): \(result.stderr)")
        }
        #expect(try await HopStore.open(path: folder.database).allRuns(flow: "startup").count == 1)
    }

    /// A prune of a mistyped flow removes nothing, as one of a flow with nothing old enough does,
    /// but says the name is unknown; a known flow's empty prune says nothing more.
    @Test func aPruneOfAFlowWithNoRunSaysSo() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for json in [false, true] {
            let mistyped = try await hopctl(
                ["prune", "--finished-before", "1d", "--flow", "startpu"] + (json ? ["--json"] : []), in: folder)
            #expect(mistyped.status == 0, "\(mistyped.stderr)")
            #expect(
                mistyped.stderr.contains("no run of flow 'startpu' is stored here (the flows here: startup)"),
                "\(mistyped.stderr)")
        }
        let known = try await hopctl(["prune", "--finished-before", "1d", "--flow", "startup"], in: folder)
        #expect(known.status == 0 && known.stderr.isEmpty, "\(known.stderr)")
        #expect(known.stdout.contains("pruned 0 runs"), "\(known.stdout)")
    }

    @Test func unknownNamesAreRuntimeErrorsThatSayWhatToDo() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        for arguments in [
            ["history", "--flow", "nope"], ["cancel", "--flow", "startup", "--subject", "nobody"],
            ["history", "--flow", "startup", "--run", "99"],
        ] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 1, "\(arguments)")
            #expect(
                result.stderr.contains(folder.database) && result.stderr.contains("hopctl status"), "\(result.stderr)")
        }
    }

    @Test func aReadCommandOnAMissingDatabaseCreatesNothing() async throws {
        let folder = try TemporaryDirectory()
        for arguments in [
            ["status"], ["history", "--flow", "startup"], ["session", "show"], ["first-use", "list"],
            ["unhop", "--flow", "startup", "--step", "onboarding"],
        ] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 1)
            #expect(result.stderr.contains("no database exists"), "\(result.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: folder.database))
    }

    @Test func aCorruptDatabaseIsReportedAndLeftAlone() async throws {
        let folder = try TemporaryDirectory()
        let garbage = Data(repeating: 0x5A, count: 4096)
        try garbage.write(to: URL(fileURLWithPath: folder.database))
        let result = try await hopctl(["status"], in: folder)
        #expect(result.status == 1)
        #expect(result.stderr.contains("not a Hop database or is damaged"))
        #expect(FileManager.default.contents(atPath: folder.database) == garbage)
    }

    @Test func aDatabaseFromANewerHopIsRefused() async throws {
        let folder = try TemporaryDirectory()
        var newer = HopStore.Options()
        newer.migrations.append(
            Migration(version: Migration.latestVersion + 1, name: "future", sql: "CREATE TABLE future (x)"))
        _ = try await HopStore.open(path: folder.database, options: newer)
        for arguments in [["status"], ["session", "logout"], ["migrate"]] {
            let result = try await hopctl(arguments, in: folder)
            #expect(result.status == 1)
            #expect(result.stderr.contains("written by a newer Hop"), "\(result.stderr)")
        }
    }

    @Test func aWriteWaitsForTheBusyTimeoutThenFailsClearlyWhileReadsGoOn() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        let holder = try ChildProcess(
            "hop-test-store", ["hold-lock", folder.database], keepInputOpen: true, directory: folder)
        try await holder.waitForOutput("locked")

        let write = try await hopctl(["session", "logout", "--busy-timeout", "200"], in: folder)
        #expect(write.status == 1)
        #expect(write.stderr.contains("database is busy"), "\(write.stderr)")
        let read = try await hopctl(["status"], in: folder)
        #expect(read.status == 0, "a read goes on beside a writer: \(read.stderr)")

        holder.closeInput()
        try await holder.waitForExit()
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.session(subject: "default") != nil, "the refused logout changed nothing")
    }
}

/// Names, subjects and tokens that could collide with, or pose as, another are refused, never repaired.
@Suite struct IdentifierCollisionTests {
    @Test func invalidUTF8ArgumentsAreRefusedNotRepairedIntoOneSubject() async throws {
        let folder = try TemporaryDirectory()
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        let hopctl = builtProduct("hopctl")
        // Through a shell, so that the arguments are raw bytes: ff fe and c0 af would both become U+FFFD U+FFFD.
        for bytes in [#"\377\376"#, #"\300\257"#] {
            let login = try await run(
                "/bin/sh",
                [
                    "-c",
                    #""\#(hopctl)" session login bob --subject "$(printf '\#(bytes)')" --db "\#(folder.database)""#,
                ], in: folder)
            #expect(login.status == 64 && login.stderr.contains("not valid UTF-8"), "\(login.stderr)")
            let show = try await run(
                "/bin/sh",
                ["-c", #""\#(hopctl)" session show --subject "$(printf '\#(bytes)')" --db "\#(folder.database)""#],
                in: folder)
            #expect(show.status == 64, "\(show.stdout)")
        }
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.session(subject: "\u{FFFD}\u{FFFD}") == nil, "a repaired subject was stored")
    }

    @Test func invisibleFormatAndControlCharactersAreRefusedInNamesButAnyScriptIsAllowed() async throws {
        let folder = try TemporaryDirectory()
        #expect(try await hopctl(["migrate"], in: folder).status == 0)
        for subject in ["ali\u{202E}ecb", "bob\u{200B}", "a\u{2028}b", "x\u{7}y", "\u{FEFF}bob"] {
            let result = try await hopctl(["session", "login", "bob", "--subject", subject], in: folder)
            #expect(
                result.status == 64,
                "subject \(subject.unicodeScalars.map { String($0.value, radix: 16) }): \(result.stdout)")
            #expect(result.stderr.contains("U+"), "\(result.stderr)")
        }
        for subject in ["Zoë", "東京-kiosk 7", "דני", "café ✓ #1"] {
            let result = try await hopctl(["session", "login", "bob", "--subject", subject], in: folder)
            #expect(result.status == 0, "subject \(subject): \(result.stderr)")
        }
        #expect(throws: HopError.self) { try Identifier.validate("evil\u{202E}", as: "subject") }
    }
}
