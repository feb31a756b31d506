import ArgumentParser
import HopTestSupport
import Testing

@testable import HopctlCommands

/// `hopctl status` and `hopctl history` are parsed without ArgumentParser when the command line
/// is plain (``QuickCommandLine``); these tests hold that parser to ArgumentParser's reading.
@Suite struct QuickCommandLineTests {
    /// ArgumentParser's reading of `arguments` as the request a quick parse would give.
    private func parsedByArgumentParser(_ arguments: [String]) -> QuickCommandLine.Request? {
        guard let command = try? Hopctl.parseAsRoot(arguments) else { return nil }
        if let status = command as? Status { return .status(status.request) }
        if let history = command as? History { return .history(history.request) }
        return nil
    }

    @Test func plainReadCommandLinesAreParsedAsArgumentParserParsesThem() throws {
        let lines: [[String]] = [
            ["status"],
            ["status", "--json"],
            ["status", "--flow", "chain", "--subject", "subject-50009", "--db", "/var/lib/hop/hop.sqlite"],
            ["status", "--flow=chain", "--status=diverged", "--db=postgres://hop@db/hop"],
            ["status", "--status", "running", "--json", "--subject", "ü-1"],
            ["history", "--flow", "startup"],
            ["history", "--flow", "f", "--subject", "u", "--run", "3", "--limit", "2", "--json", "--db", "p"],
            ["history", "--all-runs", "--flow=f", "--json"],
            ["history", "--limit=+7", "--flow", "f"],
        ]
        for line in lines {
            let quick = QuickCommandLine.request(line)
            #expect(quick != nil, "\(line) should not need ArgumentParser")
            #expect(quick == parsedByArgumentParser(line), "\(line)")
        }
    }

    @Test func anythingElseIsLeftToArgumentParser() {
        let lines: [[String]] = [
            [], ["status", "--help"], ["status", "-h"], ["history", "--help"], ["help", "status"], ["--version"],
            ["status", "--flow", "a", "--flow", "b"], ["status", "--flow"], ["status", "--flow", "--json"],
            ["status", "--status", "bogus"], ["status", "--json=yes"], ["status", "--db="], ["status", "--", "--json"],
            ["status", "extra"], ["status", "--busy-timeout", "10"], ["status", "--flow", "bad\u{1B}name"],
            ["status", "--generate-completion-script", "bash"], ["history"],
            ["history", "--flow", "f", "--limit", "0"],
            ["history", "--flow", "f", "--limit", "-1"], ["history", "--flow", "f", "--run", "x"],
            ["history", "--flow", "f", "--all-runs", "--run", "2"], ["history", "--flow", "f", "--all-runs=1"],
            ["graph", "--flow", "f"], ["unhop", "--flow", "f", "--step", "s"], ["statu"],
        ]
        for line in lines {
            #expect(QuickCommandLine.request(line) == nil, "\(line)")
        }
    }

    /// Every combination of the commands' options, in both spellings and with awkward values:
    /// whatever the quick parser accepts, ArgumentParser reads the same way.
    @Test func everyCommandLineTheQuickParserAcceptsMeansTheSameToArgumentParser() {
        let values = ["x", "", "a=b", "-x", "--json", "ü", "7", "0", "+7", "-1", "running", "diverged", "default"]
        let options: [String: [String]] = [
            "status": ["--db", "--flow", "--subject", "--status", "--json"],
            "history": ["--db", "--flow", "--subject", "--run", "--limit", "--json", "--all-runs"],
        ]
        var generator = SystemRandomNumberGenerator()
        var accepted = 0
        for (command, names) in options {
            for _ in 0..<300 {
                var line = [command]
                for _ in 0..<Int.random(in: 0...5, using: &generator) {
                    let name = names.randomElement(using: &generator) ?? "--json"
                    let value = values.randomElement(using: &generator) ?? "x"
                    switch Int.random(in: 0..<3, using: &generator) {
                    case 0: line.append(name)
                    case 1: line += [name, value]
                    default: line.append("\(name)=\(value)")
                    }
                }
                guard let quick = QuickCommandLine.request(line) else { continue }
                accepted += 1
                #expect(quick == parsedByArgumentParser(line), "\(line)")
            }
        }
        #expect(accepted > 40)
    }

    @Test func bothParsersPrintTheSameForTheSameQuestion() async throws {
        let folder = try TemporaryDirectory()
        try await completedStartup(folder)
        // An option given twice is left to ArgumentParser, which keeps the last: the same question.
        // (`hopctl(_:in:)` adds `--db` with the database.)
        // JSON: the tables say how long ago each change was, which may tick between two commands.
        for quick in [
            ["status", "--json"], ["status", "--json", "--flow", "startup"],
            ["history", "--flow", "startup", "--json"],
            ["history", "--json", "--flow", "startup", "--limit", "3"],
        ] {
            let parsed = quick + ["--db", folder.path("elsewhere.sqlite")]
            #expect(QuickCommandLine.request(quick + ["--db", folder.database]) != nil)
            #expect(QuickCommandLine.request(parsed + ["--db", folder.database]) == nil)
            let fast = try await hopctl(quick, in: folder)
            let slow = try await hopctl(parsed, in: folder)
            #expect(fast.status == 0 && slow.status == 0, "\(fast.stderr)\(slow.stderr)")
            #expect(fast.stdout == slow.stdout && !fast.stdout.isEmpty, "\(quick)")
        }
    }
}
