import ArgumentParser
import HopStore

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "One line per run: flow, subject, status, current step, last change (latest run of each flow and subject).")

    @OptionGroup var global: GlobalOptions
    @OptionGroup var output: OutputOptions

    @Option(help: ArgumentHelp("Only this flow.", valueName: "flow"))
    var flow: String?

    @Option(help: ArgumentHelp("Only this subject.", valueName: "subject"))
    var subject: String?

    func validate() throws {
        if let flow { try checkIdentifier(flow, as: "flow name") }
        if let subject { try checkIdentifier(subject, as: "subject") }
    }

    func run() async throws {
        let store = try await global.openForReading()
        let runs = try await store.runs(flow: flow, subject: subject)
        if output.json { return try Output.json(runs.map(RunJSON.init)) }
        if runs.isEmpty { return Output.note("no runs in \(store.path)") }
        Output.table(
            ["FLOW", "SUBJECT", "RUN", "STATUS", "STEP", "CHANGED"],
            runs.map { [$0.flow, $0.subject, "\($0.id)", $0.status.rawValue, $0.currentStep ?? "-", Output.relative($0.updatedAt)] })
    }
}
