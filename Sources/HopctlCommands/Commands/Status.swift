import ArgumentParser
import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension RunStatus: ExpressibleByArgument {}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract:
            "One line per run: flow, subject, status, current step, owner, last change (latest run of each flow and subject).",
        discussion: """
            STEP is the step in flight and the history entry that entered it ("approve (entry 7)"), \
            which `hopctl unhop --run ID --entry N` names. \
            OWNER is the label of the engine executing the run and whether its lease is live; \
            "-" when no engine holds the run (it is parked or finished), and "- (waits for an engine \
            with version V)" for a running run that no engine holds: one registered for the run's flow \
            and version V takes it over (a run continues on the flow version it started with).
            """)

    @OptionGroup var global: ReadOptions
    @OptionGroup var output: OutputOptions

    @Option(help: ArgumentHelp("Only this flow.", valueName: "flow"))
    var flow: String?

    @Option(help: ArgumentHelp("Only this subject.", valueName: "subject"))
    var subject: String?

    @Option(
        help: ArgumentHelp(
            "Only runs with this status: running, parked, completed, failed, cancelled or diverged "
                + "(diverged: the runs that need an operator, with the entry where each diverged and both versions).",
            valueName: "status"))
    var status: RunStatus?

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "At most this many runs (\(StatusRequest.defaultLimit) by default); a note on standard error says when more were left out.",
            valueName: "count"))
    var limit: Int?

    /// What was asked, for ``StatusRequest`` to answer.
    var request: StatusRequest {
        StatusRequest(db: global.db, json: output.json, flow: flow, subject: subject, status: status, limit: limit)
    }

    func validate() throws { try request.validate() }

    func run() async throws { try await request.run() }
}

/// What `hopctl status` was asked, from ``Status`` or from ``QuickCommandLine``, and how it is answered.
struct StatusRequest: Equatable {
    var db: String?
    var json: Bool
    var flow: String?
    var subject: String?
    var status: RunStatus?
    var limit: Int?

    /// How many runs a listing shows unless `--limit` says otherwise.
    static let defaultLimit = 1000

    func validate() throws {
        if let flow { try checkIdentifier(flow, as: "flow name") }
        if let subject { try checkIdentifier(subject, as: "subject") }
        if let limit, limit < 1 { throw ValidationError("--limit is out of range: give 1 or more runs") }
    }

    func run() async throws {
        let store = try await ReadOptions.openForReading(db)
        let shown = limit ?? Self.defaultLimit
        // One more than shown: whether the listing left runs out.
        var runs = try await store.runs(
            flow: flow, subject: subject, status: status, limit: min(shown, Int.max - 1) + 1)
        let leftOut = runs.count > shown
        runs = Array(runs.prefix(shown))
        if runs.isEmpty, let flow { try await requireFlow(flow, in: store, operation: "status") }
        defer {
            if leftOut {
                Output.note(
                    "showing the first \(shown) runs by flow and subject; more were left out: narrow the listing "
                        + "with --flow, --subject or --status, or raise --limit")
            }
        }
        let now = store.now()  // the database's clock: a server's, whatever this machine's says
        var divergences: [Int64: String] = [:]
        for run in runs where run.status == .diverged {
            divergences[run.id] = try await store.history(runID: run.id, limit: 4).last { $0.kind == .diverge }?.value
        }
        if json { return try Output.json(try await RunJSON.list(runs, in: store, divergences: divergences)) }
        if runs.isEmpty {
            return Output.note(
                status.map { "no \($0.rawValue) runs in \(store.location)" } ?? "no runs in \(store.location)")
        }
        if status == .diverged {
            return Output.table(
                ["FLOW", "SUBJECT", "RUN", "DIVERGED AT", "CODE", "RUN VERSION", "CHANGED"],
                runs.map { run in
                    let divergence = DivergenceJSON(message: divergences[run.id] ?? "")
                    return [
                        run.flow, run.subject, "\(run.id)", divergence.entry.map { "entry \($0)" } ?? "-",
                        divergence.codeVersion ?? "-", divergence.runVersion ?? run.flowVersion,
                        Output.relative(run.updatedAt, now: now),
                    ]
                })
        }
        let entries = try await store.stepEntries(runIDs: runs.filter { $0.currentStep != nil }.map(\.id))
        Output.table(
            ["FLOW", "SUBJECT", "RUN", "STATUS", "STEP", "OWNER", "CHANGED"],
            runs.map { run in
                [
                    run.flow, run.subject, "\(run.id)", run.status.rawValue,
                    run.currentStep.map { step in entries[run.id].map { "\(step) (entry \($0))" } ?? step } ?? "-",
                    Self.owner(run, now: now),
                    Output.relative(run.updatedAt, now: now),
                ]
            })
    }

    /// The owner's label and whether its lease is live; "-" when none holds the run, with the
    /// version an engine needs to take a running run over.
    static func owner(_ run: RunRecord, now: Date) -> String {
        guard let label = run.ownerLabel else {
            return run.status == .running ? "- (waits for an engine with version \(run.flowVersion))" : "-"
        }
        return "\(label) (lease \(run.leaseIsLive(at: now) ? "live" : "expired"))"
    }
}

/// Fails, as history does, when no run of `flow` exists at all: the name is likely mistyped.
func requireFlow(_ flow: String, in store: any HopAdministration, operation: String) async throws {
    let flows = try await store.flowNames()
    guard !flows.contains(flow) else { return }
    throw HopError(
        .notFound, operation: operation, path: store.location, reason: "there is no run of flow '\(flow)'",
        hint: flows.isEmpty
            ? "No flow has run here yet" : "The flows here: \(flows.joined(separator: ", ")) (see `hopctl status`)")
}
