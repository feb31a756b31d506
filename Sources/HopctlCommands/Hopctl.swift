import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// hopctl's commands, run by the `hopctl` and `hopctl-postgres` executables.
package struct Hopctl: AsyncParsableCommand {
    package static let configuration = CommandConfiguration(
        commandName: "hopctl",
        abstract: "Inspect and steer Hop flows in a Hop database, beside a running daemon.",
        discussion: """
            The database is --db PATH (a file, or a postgres:// URL), else $HOP_DB, else $XDG_STATE_HOME/hop/hop.sqlite, else ~/.local/state/hop/hop.sqlite.
            Exit codes: 0 success, 64 usage error, 1 runtime error (message on standard error).
            """,
        version: "hopctl \(HopVersion.current)",
        subcommands: [
            Migrate.self, Status.self, History.self, Start.self, Unhop.self, Cancel.self, Restart.self,
            ResetFirstUse.self,
            FirstUse.self, SessionCommand.self, Graph.self, Patches.self, Fork.self, Backup.self, Prune.self, Copy.self,
        ]
    )

    package init() {}

    /// Parses the command line (accepting `--db` and `--busy-timeout` before the command too) and runs it.
    package static func runCommandLine() async {
        do {
            try checkArgumentsAreUTF8()
            let arguments = GlobalOptions.hoisted(Array(CommandLine.arguments.dropFirst()))
            if let request = QuickCommandLine.request(arguments) {
                try await closingDatabases { try await request.run() }
            } else {
                try checkCommandIsKnown(arguments)
                var command = try parseAsRoot(arguments)
                try await closingDatabases {
                    if var asynchronous = command as? AsyncParsableCommand {
                        try await asynchronous.run()
                    } else {
                        try command.run()
                    }
                }
            }
        } catch let error as UsageError {
            // Found while running (standard input, say): the message alone, not the whole usage.
            StandardStream.write("Error: \(error.message)\n", to: STDERR_FILENO)
            Glibc.exit(ExitCode.validationFailure.rawValue)
        } catch {
            exit(withError: error)
        }
    }
}

/// Runs `body`, then closes the server connections it opened, whether it succeeded or not.
private func closingDatabases(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch {
        await OpenDatabases.closeAll()
        throw error
    }
    await OpenDatabases.closeAll()
}

/// Refuses an argument that is not valid UTF-8. Swift would repair it into U+FFFD, so that two
/// different byte strings became the same name (and one subject saw another's session); the
/// argument itself is not repeated, as it may be a secret.
func checkArgumentsAreUTF8() throws {
    for index in 1..<Int(CommandLine.argc) {
        guard let argument = CommandLine.unsafeArgv[index] else { continue }
        let bytes = UnsafeBufferPointer(
            start: UnsafeRawPointer(argument).assumingMemoryBound(to: UInt8.self), count: strlen(argument))
        if String(validating: bytes, as: UTF8.self) == nil {
            throw UsageError(
                "argument \(index) is not valid UTF-8; names, subjects, keys, paths and tokens must be UTF-8 text (nothing was changed)"
            )
        }
    }
}

/// Refuses an unknown command with the closest known one, e.g. `statuss` → `status`.
func checkCommandIsKnown(_ arguments: [String]) throws {
    guard let word = arguments.first, !word.hasPrefix("-") else { return }
    let commands =
        Hopctl.configuration.subcommands.map { $0.configuration.commandName ?? String(describing: $0).lowercased() } + [
            "help"
        ]
    guard !commands.contains(word) else { return }
    let closest = commands.min { editDistance(word, $0) < editDistance(word, $1) }
    var message = "'\(Output.printable(String(word.prefix(40))))' is not a hopctl command"
    if let closest, editDistance(word, closest) <= max(2, closest.count / 3) {
        message += "; did you mean `hopctl \(closest)`?"
    }
    throw UsageError(
        message + " The commands: \(commands.filter { $0 != "help" }.joined(separator: ", ")) (see `hopctl --help`)")
}

/// The Levenshtein distance between `a` and `b`.
func editDistance(_ a: String, _ b: String) -> Int {
    let a = Array(a)
    let b = Array(b)
    var previous = Array(0...b.count)
    for (i, x) in a.enumerated() {
        var current = [i + 1]
        for (j, y) in b.enumerated() {
            current.append(min(previous[j + 1] + 1, current[j] + 1, previous[j] + (x == y ? 0 : 1)))
        }
        previous = current
    }
    return previous[b.count]
}

/// A usage error found once the command runs (exit 64), e.g. in what standard input held.
struct UsageError: Error {
    var message: String
    init(_ message: String) { self.message = message }
}
