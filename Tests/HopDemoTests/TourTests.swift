import Foundation
import HopTestSupport
import Testing

/// The README's five-minute tour, run command by command in the README's order against the built
/// binaries; every output must be the README's, times and tokens aside.
@Suite struct TourTests {
    /// One `$ command` of the tour's console blocks and the output the README shows for it.
    struct Step {
        var command: String
        var expected: [String]
    }

    /// On a file, and on a PostgreSQL server (`HOP_DB=postgres://…`): the same output.
    @Test(arguments: TestBackend.all)
    func theTourInTheREADMEReproducesItsOwnOutput(backend: TestBackend) async throws {
        let steps = try Self.tour()
        let commands = steps.map(\.command)
        #expect(
            commands == [
                "hop-demo --auto", "hop-demo --auto", "hopctl reset-first-use onboarding", "hopctl session logout",
                "hop-demo",
                "hopctl status", "hopctl unhop --flow startup --step onboarding",
                "hopctl session login alice --expires-in 30d",
                "hop-demo", "hopctl history --flow startup --limit 6", "hopctl graph --flow startup",
                "hop-demo --subject kiosk-1", "hop-demo --flow-version 2 --subject kiosk-1 --auto",
                "hop-demo --flow-version 2 --subject kiosk-2 --auto",
            ], "the tour changed: update this test with it")
        guard commands.count == 14 else { return }
        let folder = try TemporaryDirectory()
        let environment = ["HOP_DB": try await backend.location(folder)]

        for index in 0...3 { try await check(steps[index], try await run(steps[index], in: folder, environment)) }

        // Killed while it waits at onboarding.
        try await checkKilled(steps[4], in: folder, environment)

        // Started again; from a second terminal: status, unhop, login.
        let resumed = try start(steps[8], in: folder, environment)
        defer { resumed.kill() }
        try await resumed.waitForOutput("waiting for onboarding to finish")
        try await check(steps[5], try await run(steps[5], in: folder, environment))
        try await check(steps[6], try await run(steps[6], in: folder, environment))
        try await resumed.waitForOutput("waiting for a login")
        try await check(steps[7], try await run(steps[7], in: folder, environment))
        #expect(try await resumed.waitForExit() == 0)
        try await check(steps[8], (resumed.stdout, resumed.stderr))

        for index in 9...10 { try await check(steps[index], try await run(steps[index], in: folder, environment)) }

        // A new version: a kiosk's run killed at onboarding on version 1, then the build with version 2.
        try await checkKilled(steps[11], in: folder, environment)
        for index in 12...13 { try await check(steps[index], try await run(steps[index], in: folder, environment)) }
    }

    /// Runs `step` until it prints the README's last line before "Killed", then kills it.
    private func checkKilled(_ step: Step, in folder: TemporaryDirectory, _ environment: [String: String]) async throws
    {
        let killed = try start(step, in: folder, environment)
        let lastLine = try #require(step.expected.last { $0 != "Killed" })
        try await killed.waitForOutput(String(lastLine.drop { $0 == " " }.prefix(30)))
        killed.kill()
        try await killed.waitForExit()
        try await check(step, (killed.stdout + "Killed\n", killed.stderr))
    }

    private func run(
        _ step: Step, in folder: TemporaryDirectory, _ environment: [String: String]
    ) async throws -> (String, String) {
        let child = try start(step, in: folder, environment)
        #expect(try await child.waitForExit() == 0, "\(step.command): \(child.stderr)")
        return (child.stdout, child.stderr)
    }

    private func start(
        _ step: Step, in folder: TemporaryDirectory, _ environment: [String: String]
    ) throws -> ChildProcess {
        let words = step.command.split(separator: " ").map(String.init)
        return try ChildProcess(words[0], Array(words.dropFirst()), environment: environment, directory: folder)
    }

    private func check(_ step: Step, _ output: (stdout: String, stderr: String)) async throws {
        let shown = Self.normalized(step.expected)
        let printed = Self.normalized(
            output.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).filter {
                !$0.isEmpty
            })
        #expect(
            printed == shown,
            "`\(step.command)` printed:\n\(output.stdout)\(output.stderr)\nthe README shows:\n\(step.expected.joined(separator: "\n"))"
        )
    }

    /// Lines with what differs from run to run replaced: elapsed times, ages, tokens, the database path.
    static func normalized(_ lines: [String]) -> [String] {
        lines.map { line in
            var line = line
            line = line.replacing(/\[\s*\d+\.\d\ds\]/, with: "[T]")
            line = line.replacing(/\b(\d+[smhd])+ ago\b/, with: "AGO")
            line = line.replacing(/[0-9a-f]{4}…\*{8}/, with: "TOKEN")
            line = line.replacing(/\/\S*hop\.sqlite|\/tmp\/hop-tour\.sqlite|postgres:\/\/\S+/, with: "DB")
            return line.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
        }
    }

    /// The tour's `$` commands and outputs, from the README's console blocks.
    static func tour() throws -> [Step] {
        let readme = try String(contentsOf: packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        guard let start = readme.range(of: "## A five-minute tour"), let end = readme.range(of: "## Writing a flow")
        else {
            throw TestFailure("the README has no tour section")
        }
        var steps: [Step] = []
        var inConsole = false
        for line in readme[start.upperBound..<end.lowerBound].split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") {
                inConsole = line == "```console"
                continue
            }
            guard inConsole else { continue }
            if line.hasPrefix("$ ") {
                steps.append(Step(command: String(line.dropFirst(2)), expected: []))
            } else if !line.isEmpty, !steps.isEmpty {
                steps[steps.count - 1].expected.append(String(line))
            }
        }
        return steps
    }

    static var packageRoot: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
    }
}
