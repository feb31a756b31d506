import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The flow and subject a steering command acts on.
struct RunSelection: ParsableArguments {
    @Option(help: ArgumentHelp("The flow.", valueName: "flow"))
    var flow: String

    @OptionGroup var subjectOption: SubjectOption

    var subject: String { subjectOption.subject }

    func validate() throws { try checkIdentifier(flow, as: "flow name") }
}

/// `--run ID` of a steering command: the run it is meant for, so that a retry changes nothing.
struct NamedRunOption: ParsableArguments {
    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "The run meant (see `hopctl status`): refused, changing nothing, when it is no longer the one the command acts on.",
            valueName: "id"))
    var run: Int64?

    func validate() throws { try checkRunID(run) }
}

struct Unhop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unhop",
        abstract: "Finish the step the run is parked on, exactly once; a running daemon proceeds at once.",
        discussion: """
            The step is named, so a retried command never finishes another step after it: when the run is \
            not parked on --step, nothing changes and the command fails, saying where the run is. A flow \
            may park on the same step again (a second approval): name the parking with --run and --entry \
            (both in `hopctl status`), and a retried command never finishes the next one. A step that \
            finishes when a session is stored (a login step) is finished by `hopctl session login`.
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var selection: RunSelection
    @OptionGroup var named: NamedRunOption

    @Option(help: ArgumentHelp("The step the run is parked on (see `hopctl status`).", valueName: "step"))
    var step: String

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "With --run, the history entry that parked the run on --step (see `hopctl status`): refused, changing nothing, once that step has ended.",
            valueName: "n"))
    var entry: Int64?

    @Option(help: ArgumentHelp("The step's output, as JSON (e.g. '{\"accepted\": true}').", valueName: "json"))
    var output: String?

    func validate() throws {
        try checkIdentifier(step, as: "step name")
        if let entry {
            guard named.run != nil else {
                throw ValidationError(
                    "--entry needs --run: entries are numbered in each run (see `hopctl status`)")
            }
            guard entry >= 1 else { throw ValidationError("--entry is out of range: give an entry number (1 or more)") }
        }
        if let output {
            do {
                try JSONText.validate(output, as: "--output value")
            } catch let error as HopError {
                throw ValidationError("\(error.reason). \(error.hint ?? "")")
            }
        }
    }

    func run() async throws {
        let store = try await global.openForWriting()
        let (run, unhop) = try await store.unhopParked(
            flow: selection.flow, subject: selection.subject, step: step, runID: named.run, entry: entry,
            output: output)
        let parking = entry.map { " (entry \($0))" } ?? ""
        Output.line(
            "unhopped \(Output.printable(unhop.step ?? "?"))\(parking) of run \(run.id) (\(Output.printable(run.flow)) for \(Output.printable(run.subject))); the daemon moves the run on"
        )
    }
}

struct Cancel: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cancel",
        abstract: "Cancel the run: it never advances again. Its history is kept.",
        discussion: """
            The subject's unfinished run of the flow; with --run, only that run: a retried command \
            (or one meant for a run that ended meanwhile) changes nothing and says where the flow is.
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var selection: RunSelection
    @OptionGroup var named: NamedRunOption

    func run() async throws {
        let store = try await global.openForWriting()
        let run = try await store.cancelRun(
            flow: selection.flow, subject: selection.subject, runID: named.run, reason: "cancelled by hopctl")
        Output.line("cancelled run \(run.id) (\(Output.printable(run.flow)) for \(Output.printable(run.subject)))")
    }
}

struct Restart: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restart",
        abstract:
            "Start the flow over: a new run begins from the first step the next time the daemon runs it. The old run's history is kept.",
        discussion: """
            Ends the subject's latest run of the flow (cancels it when unfinished); with --run, only \
            when that run is still the latest: a retried command never starts over the run the \
            first one made, and changes nothing.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var selection: RunSelection
    @OptionGroup var named: NamedRunOption

    func run() async throws {
        let store = try await global.openForWriting()
        let run = try await store.restartRun(
            flow: selection.flow, subject: selection.subject, runID: named.run, version: nil)
        Output.line(
            "run \(run.id) of \(Output.printable(run.flow)) for \(Output.printable(run.subject)) starts from the beginning; earlier runs are kept"
        )
    }
}

struct ResetFirstUse: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reset-first-use",
        abstract: "Make features first-use again, so the next start shows them (e.g. onboarding) again.")

    @OptionGroup var global: GlobalOptions
    @OptionGroup var subjectOption: SubjectOption

    @Argument(help: ArgumentHelp("The features to reset.", valueName: "name"))
    var features: [String] = []

    @Flag(help: "Reset every feature of the subject.")
    var all = false

    @Option(
        help: ArgumentHelp(
            "With one feature, only while its flag is the one set at this time (as `hopctl first-use list` shows it, e.g. 2026-11-26T09:16:46Z): refused, changing nothing, once a flow has used it again.",
            valueName: "time"))
    var ifUsedAt: String?

    func validate() throws {
        if all && !features.isEmpty { throw ValidationError("name features or pass --all, not both") }
        if !all && features.isEmpty {
            throw ValidationError("name the features to reset (e.g. onboarding), or pass --all")
        }
        for feature in features { try checkIdentifier(feature, as: "feature name") }
        if ifUsedAt != nil {
            guard features.count == 1 else {
                throw ValidationError("--if-used-at names the flag of one feature: name exactly one")
            }
            _ = try usedAt()
        }
    }

    /// `--if-used-at` as a date, or why it is not one.
    private func usedAt() throws -> Date? {
        guard let ifUsedAt else { return nil }
        guard let date = try? Date.ISO8601FormatStyle().parse(ifUsedAt) else {
            throw ValidationError(
                "--if-used-at takes a time as `hopctl first-use list --json` shows it, e.g. 2026-11-26T09:16:46Z")
        }
        return date
    }

    func run() async throws {
        let store = try await global.openForWriting()
        let subject = subjectOption.subject
        if let usedAt = try usedAt(), let feature = features.first {
            let count = try await store.resetFirstUse(subject: subject, feature: feature, ifUsedAt: usedAt)
            return Output.line(
                count > 0
                    ? "\(Output.printable(feature)) is first-use again for \(Output.printable(subject)) (1 flag cleared)"
                    : "no first-use flag was set for \(Output.printable(subject)) of \(Output.printable(feature)); nothing to clear"
            )
        }
        if all {
            let count = try await store.resetAllFirstUse(subject: subject)
            return Output.line(
                "every feature is first-use again for \(Output.printable(subject)) (\(count) flag\(count == 1 ? "" : "s") cleared)"
            )
        }
        let set = Set(try await store.firstUseFlags(subject: subject).map(\.feature))
        let count = try await store.resetFirstUse(subject: subject, features: features)
        let cleared = features.filter(set.contains)
        if !cleared.isEmpty {
            Output.line(
                "\(cleared.map(Output.printable).joined(separator: ", ")) \(cleared.count == 1 ? "is" : "are") first-use again for \(Output.printable(subject)) (\(count) flag\(count == 1 ? "" : "s") cleared)"
            )
        }
        let unknown = features.filter { !set.contains($0) }
        if !unknown.isEmpty {
            let known =
                set.isEmpty
                ? "no feature is marked used"
                : "the features marked used: \(set.sorted().map(Output.printable).joined(separator: ", "))"
            Output.line(
                "no first-use flag was set for \(Output.printable(subject)) of \(unknown.map(Output.printable).joined(separator: ", ")) (\(known)); nothing to clear"
            )
        }
    }
}

struct FirstUse: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "first-use", abstract: "First-use flags.", subcommands: [List.self])

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "The features the subject has used; any other is on its first use.")

        @OptionGroup var global: ReadOptions
        @OptionGroup var subjectOption: SubjectOption
        @OptionGroup var output: OutputOptions

        func run() async throws {
            let store = try await global.openForReading()
            let subject = subjectOption.subject
            let flags = try await store.firstUseFlags(subject: subject)
            if output.json {
                return try Output.json(
                    flags.map { FirstUseJSON(subject: subject, feature: $0.feature, usedAt: $0.usedAt) })
            }
            if flags.isEmpty { return Output.note("no feature used yet by \(subject): everything is on its first use") }
            Output.table(
                ["SUBJECT", "FEATURE", "USED"],
                flags.map { [subject, $0.feature, Output.relative($0.usedAt, now: store.now())] })
        }
    }
}
