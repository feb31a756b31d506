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

struct SessionCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "session", abstract: "Stored user sessions.", subcommands: [Login.self, Logout.self, Show.self])

    struct Login: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "login",
            abstract: "Store a session for USER; a run parked on a login step moves on.",
            discussion:
                "The token is read from standard input with --token-stdin, or generated. It is never taken as an argument, which would leave it in shell history and `ps`."
        )

        @OptionGroup var global: GlobalOptions
        @OptionGroup var subjectOption: SubjectOption

        @Argument(help: ArgumentHelp("The user id.", valueName: "user"))
        var user: String

        @Option(
            parsing: .unconditional,
            help: ArgumentHelp(
                "How long the session lasts, at least 1s: 90s, 30m, 12h, 7d (default: it never expires).",
                valueName: "duration"))
        var expiresIn: String?

        @Flag(help: "Read the session token from standard input (its trailing newline is dropped).")
        var tokenStdin = false

        /// Anything after the user id: a token typed as an argument, which is refused without being echoed.
        @Argument(parsing: .allUnrecognized, help: ArgumentHelp(visibility: .private))
        var extra: [String] = []

        func validate() throws {
            try checkIdentifier(user, as: "user id")
            guard extra.isEmpty else {
                // Never repeat what was given: it may be the token.
                throw ValidationError(
                    "session login takes one argument, the user id; a token is never taken as an argument (it would stay in shell history and `ps`): pipe it to --token-stdin"
                )
            }
            if let expiresIn {
                guard let seconds = DurationText.seconds(expiresIn) else {
                    throw ValidationError(
                        "--expires-in is not a duration: write a number followed by s, m, h or d (e.g. 12h)")
                }
                guard seconds >= 1, seconds <= DurationText.maximum else {
                    throw ValidationError(
                        "--expires-in is out of range: a session lasts from 1s to 100 years (e.g. 12h)")
                }
            }
        }

        func run() async throws {
            let token: String
            if tokenStdin {
                token = try Self.readToken()
            } else {
                token = Token.random(byteCount: 32)
            }
            let store = try await global.openForWriting()
            // By the database's clock (a server's, whatever this machine's says), from now.
            let asked = store.now()
            let expiresAt = expiresIn.flatMap(DurationText.seconds).map { asked.addingTimeInterval($0) }
            let subject = subjectOption.subject
            let woken = try await store.storeSession(subject: subject, userID: user, token: token, expiresAt: expiresAt)
            var text =
                "stored session of \(Output.printable(user)) for \(Output.printable(subject)) (token \(StoredSession.redact(token)))"
            // As asked ("in 30d"), however long opening the database took.
            text += expiresAt.map { ", expires \(Output.relative($0, now: asked))" } ?? ", never expires"
            Output.line(text)
            for run in woken { Output.line("run \(run) was waiting for a login: it moves on") }
        }

        /// The token on standard input: UTF-8 exactly as given (never repaired), without its
        /// trailing newline, 1 to 4096 bytes. Its content never appears in an error.
        static func readToken() throws -> String {
            var bytes = StandardStream.readInput(limit: .max) ?? []
            while let last = bytes.last, last == 0x0A || last == 0x0D { bytes.removeLast() }
            guard !bytes.isEmpty else {
                throw UsageError(
                    "--token-stdin read no token from standard input: pipe the token in, e.g. `printf %s \"$TOKEN\" | hopctl session login USER --token-stdin`"
                )
            }
            guard bytes.count <= StoredSession.maximumTokenBytes else {
                throw UsageError(
                    "the token on standard input is \(bytes.count) bytes; a session token is at most \(StoredSession.maximumTokenBytes) bytes"
                )
            }
            guard let token = String(validating: bytes, as: UTF8.self),
                !token.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
            else {
                throw UsageError(
                    "the token on standard input is not valid UTF-8 text (or holds control characters); it was not stored"
                )
            }
            return token
        }
    }

    struct Logout: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "logout", abstract: "Remove the subject's stored session.",
            discussion: """
                With --user, only that user's session: a retried command never logs out a user who \
                logged in after the first; it changes nothing and fails, saying so.
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var subjectOption: SubjectOption

        @Option(
            help: ArgumentHelp(
                "The user whose session is meant: refused, changing nothing, when another user's is stored.",
                valueName: "user"))
        var user: String?

        func validate() throws {
            if let user { try checkIdentifier(user, as: "user id") }
        }

        func run() async throws {
            let store = try await global.openForWriting()
            let subject = subjectOption.subject
            let (removed, rerouted) = try await store.deleteSession(subject: subject, userID: user)
            if removed {
                Output.line("logged out \(Output.printable(subject)): the next start goes through login")
            } else {
                Output.line("no session was stored for \(Output.printable(subject))")
            }
            for run in rerouted { Output.line("run \(run) was re-routed by the logout") }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show",
            abstract: "The subject's stored session; the token redacted unless --reveal-token.")

        @OptionGroup var global: ReadOptions
        @OptionGroup var subjectOption: SubjectOption
        @OptionGroup var output: OutputOptions

        @Flag(help: "Show the session token itself.")
        var revealToken = false

        func run() async throws {
            let store = try await global.openForReading()
            let subject = subjectOption.subject
            guard let session = try await store.session(subject: subject) else {
                if output.json { return try Output.json(SessionJSON?.none) }
                return Output.line("no session stored for \(Output.printable(subject))")
            }
            let token = revealToken ? session.token : StoredSession.redact(session.token)
            if output.json {
                return try Output.json(
                    SessionJSON(
                        subject: subject, userID: session.userID, token: token, tokenRedacted: !revealToken,
                        createdAt: session.createdAt, expiresAt: session.expiresAt))
            }
            Output.table(
                ["SUBJECT", "USER", "TOKEN", "CREATED", "EXPIRES"],
                [
                    [
                        subject, session.userID, token, Output.relative(session.createdAt, now: store.now()),
                        session.expiresAt.map { Output.relative($0, now: store.now()) } ?? "never",
                    ]
                ])
        }
    }
}

/// Durations as operators type them: 90s, 30m, 12h, 7d (or plain seconds).
enum DurationText {
    static func seconds(_ text: String) -> TimeInterval? {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        var number = Substring(text)
        var unit = 1.0
        if let last = text.last, let scale = units[last] {
            number = number.dropLast()
            unit = scale
        }
        guard let value = Double(number), value.isFinite else { return nil }
        return value * unit
    }

    /// At most 100 years: beyond that, a duration is a typo, not an expiry.
    static let maximum: TimeInterval = 100 * 365 * 86_400
}
