import ArgumentParser
import HopStore

struct Fork: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fork",
        abstract: "Start a new run that takes a run's history up to an entry as done and continues on current code.",
        discussion: """
            For a run that diverged after a code change, or is stuck: the new run takes entries 1 to \
            --from of the old run (the latest run of the flow for the subject, or --run) as done — no \
            step before that entry runs again, its decisions and outputs stand — and a daemon with the \
            flow's version (--flow-version, else the old run's) carries it on from there. The old run, \
            ended if it was unfinished, and the new one are linked by `fork` entries in their \
            histories. Choose --from from `hopctl history`: an entry where no step is in flight \
            (`hopctl status --status diverged` shows where each diverged run stopped agreeing).
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var selection: RunSelection
    @OptionGroup var output: OutputOptions

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp("The run to fork (see `hopctl status`) instead of the latest.", valueName: "id"))
    var run: Int64?

    @Option(
        name: .customLong("from"), parsing: .unconditional,
        help: ArgumentHelp("The last entry of the old run the new run takes as done.", valueName: "seq"))
    var through: Int64

    @Option(
        name: .customLong("flow-version"),
        help: ArgumentHelp("The flow version the new run continues on (default: the old run's).", valueName: "v"))
    var flowVersion: String?

    @OptionGroup var formerSpelling: FormerFlowVersionOption

    var version: String? { flowVersion ?? formerSpelling.version }

    func validate() throws {
        if through < 1 { throw ValidationError("--from is out of range: history entries are 1 or more") }
        try checkRunID(run)
        try formerSpelling.check(besides: flowVersion)
        if let version { try checkIdentifier(version, as: "flow version") }
    }

    func run() async throws {
        let store = try await global.openForWriting()
        let (old, new) = try await store.forkRun(
            flow: selection.flow, subject: selection.subject, runID: run, through: through, version: version)
        if output.json {
            let runs = try await RunJSON.list([old, new], in: store)
            return try Output.json(ForkJSON(old: runs[0], new: runs[1], through: through))
        }
        Output.line(
            "forked run \(old.id) through entry \(through) into run \(new.id) (\(Output.printable(new.flow)) for \(Output.printable(new.subject)), version \(Output.printable(new.flowVersion))); a daemon with that version carries it on"
        )
    }
}
