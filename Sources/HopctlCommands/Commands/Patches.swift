import ArgumentParser
import HopStore

struct Patches: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "patches",
        abstract: "The patches of a flow's code that runs took, or the runs that may still need one's old branch.",
        discussion: """
            Without --patch: one line per patch whose new branch a run took (its marker in history): how \
            many runs took it, since when, and how many unfinished runs have no marker of it. \
            With --patch: those unfinished runs. A run without the marker may still need the patch's \
            old branch (or not have reached the patch yet); once none is left, delete the old branch \
            and the `patched` call.
            """)

    @OptionGroup var global: ReadOptions
    @OptionGroup var output: OutputOptions

    @Option(help: ArgumentHelp("The flow.", valueName: "flow"))
    var flow: String

    @Option(help: ArgumentHelp("One patch, by the name given to flow.patched(…).", valueName: "name"))
    var patch: String?

    func validate() throws {
        try checkIdentifier(flow, as: "flow name")
        if let patch { try checkIdentifier(patch, as: "patch name") }
    }

    func run() async throws {
        let store = try await global.openForReading()
        try await requireFlow(flow, in: store, operation: "patches")
        if let patch {
            let runs = try await store.runsWithoutPatch(flow: flow, patch: patch)
            if output.json { return try Output.json(try await RunJSON.list(runs, in: store)) }
            if runs.isEmpty {
                return Output.note(
                    "no unfinished run of \(Output.printable(flow)) lacks the marker of \(Output.printable(patch)): "
                        + "no run needs its old branch, which can be deleted")
            }
            Output.table(
                ["RUN", "SUBJECT", "STATUS", "STEP", "VERSION"],
                runs.map { ["\($0.id)", $0.subject, $0.status.rawValue, $0.currentStep ?? "-", $0.flowVersion] })
            return
        }
        let patches = try await store.patches(flow: flow)
        var rows: [PatchJSON] = []
        for usage in patches {
            let without = try await store.runsWithoutPatch(flow: flow, patch: usage.name).count
            rows.append(
                PatchJSON(
                    patch: usage.name, runs: usage.runs, firstRecordedAt: usage.firstRecordedAt,
                    unfinishedWithout: without))
        }
        if output.json { return try Output.json(rows) }
        if rows.isEmpty { return Output.note("no run of \(Output.printable(flow)) has taken a patch's new branch") }
        Output.table(
            ["PATCH", "RUNS", "FIRST", "UNFINISHED WITHOUT IT"],
            rows.map {
                [
                    "\($0.patch)", "\($0.runs)", Output.relative($0.firstRecordedAt, now: store.now()),
                    "\($0.unfinishedWithout)",
                ]
            })
    }
}
