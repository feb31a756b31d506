import ArgumentParser
import HopStore

struct Start: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "start",
        abstract: "Start a run of a flow for a subject; a daemon that runs the flow picks it up at once.",
        discussion: """
            The run is recorded with no owner; the first daemon with the flow's version that sees \
            the change claims it and executes it from the first step, as it would a run it started \
            itself. The version is --flow-version, else that of the flow's newest run here. Refused, \
            changing nothing, when the subject has an unfinished run of the flow (`hopctl status` \
            shows it), and when no run of the flow has ever run here (a mistyped name, say): pass \
            --force with --flow-version to start the first run of a flow a daemon has registered. \
            A run that finished does not stop a second start: to retry a start safely, name the \
            subject's latest run with --latest (`none` before its first).
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var selection: RunSelection
    @OptionGroup var output: OutputOptions

    @Option(
        name: .customLong("flow-version"),
        help: ArgumentHelp(
            "The flow version the run executes on (default: that of the flow's newest run here).", valueName: "v"))
    var flowVersion: String?

    @OptionGroup var formerSpelling: FormerFlowVersionOption

    @Flag(help: "Start the run even when no run of the flow has run here yet (needs --flow-version).")
    var force = false

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "The subject's latest run of the flow (see `hopctl status`), or `none` for its first: refused, changing nothing, when it no longer is, so that a retried command never starts a second run.",
            valueName: "id|none"))
    var latest: ExpectedLatestRun?

    var version: String? { flowVersion ?? formerSpelling.version }

    func validate() throws {
        try formerSpelling.check(besides: flowVersion)
        if let version { try checkIdentifier(version, as: "flow version") }
    }

    func run() async throws {
        let store = try await global.openForWriting()
        let run = try await store.startNewRun(
            flow: selection.flow, subject: selection.subject, version: version, allowingNewFlow: force,
            latest: latest)
        if output.json { return try Output.json(try await RunJSON.list([run], in: store)[0]) }
        Output.line(
            "started run \(run.id) of \(Output.printable(run.flow)) for \(Output.printable(run.subject)) (version \(Output.printable(run.flowVersion))); a daemon that runs the flow picks it up"
        )
    }
}

extension ExpectedLatestRun: ExpressibleByArgument {
    /// `none`, or a run id of 1 or more.
    public init?(argument: String) {
        if argument == "none" {
            self = .noRun
        } else if let id = Int64(argument), id >= 1 {
            self = .run(id)
        } else {
            return nil
        }
    }
}
