import ArgumentParser
import Foundation

/// Measures Hop's performance, side by side with raw SQLite on the same disk.
@main
struct HopBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hop-bench",
        abstract: "Measure Hop's hops per second, resume time, hopctl latency and memory, next to raw SQLite.",
        discussion: """
            Each scenario runs in a process of its own, on a temporary database on the local disk \
            (synchronous=FULL unless its name ends in -normal). Prints a table, then one line per \
            figure: `name value unit`.
            """)

    static let scenarios = [
        "durable-hops", "durable-hops-normal", "concurrent-hops", "startup-flow", "startup-flow-normal",
        "resume", "long-history", "hopctl", "parked-memory", "fleet", "durable-hops-postgres",
        "long-history-postgres",
    ]

    /// Parts of scenarios that run in a process of their own.
    static let internalScenarios = ["parked-memory-restart", "fleet-worker"]

    /// What the issue asks of each figure: (figure, at least, at most).
    static let targets: [String: (atLeast: Double?, atMost: Double?)] = [
        "durable-hops.ratio": (0.90, nil),
        "concurrent-hops.ratio": (5, nil),
        "startup-flow.sequential.ratio": (0.85, nil),
        "resume.seconds": (nil, 2),
        "resume.peak-memory": (nil, 128),
        "hopctl.status.median": (nil, 6),
        "hopctl.history.median": (nil, 20),
        "parked-memory.peak": (nil, 64),
        "parked-memory.restarted-peak": (nil, 64),
    ]

    @Flag(help: "Small sizes: every scenario runs, in under a minute, to prove the benchmark works.")
    var quick = false

    @Option(name: .customLong("only"), help: ArgumentHelp("Run only this scenario (repeatable).", valueName: "name"))
    var only: [String] = []

    @Option(help: ArgumentHelp("Where the temporary databases go (default: the temporary folder).", valueName: "path"))
    var folder: String?

    @Option(help: .hidden)
    var child: String?

    // A fleet worker's database, subjects' prefix and number of flows.
    @Option(help: .hidden) var db: String?
    @Option(help: .hidden) var prefix = "p"
    @Option(help: .hidden) var count = 0

    func validate() throws {
        for name in only + (child.map { [$0] } ?? []) where !(Self.scenarios + Self.internalScenarios).contains(name) {
            throw ValidationError(
                "no scenario is named '\(name)'; the scenarios are \(Self.scenarios.joined(separator: ", "))")
        }
    }

    func run() async throws {
        let base = URL(fileURLWithPath: folder ?? FileManager.default.temporaryDirectory.path)
        if let child {
            let scenarios = Scenarios(folder: base, quick: quick)
            let figures =
                child == "fleet-worker"
                ? try await scenarios.fleetWorker(database: db ?? "", prefix: prefix, count: count)
                : try await scenarios.run(child)
            for figure in figures { print(figure.line) }
            // Steps a scenario left in flight are not waited for: the process ends here.
            fflush(nil)
            Foundation.exit(0)
        }
        let workspace = base.appendingPathComponent("hop-bench-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: workspace, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: workspace) }
        var figures: [Figure] = []
        var failed: [String] = []
        for name in only.isEmpty ? Self.scenarios : only {
            FileHandle.standardError.write(Data("hop-bench: \(name)…\n".utf8))
            let folder = workspace.appendingPathComponent(name)
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            do {
                figures += try runChild(name, folder: folder)
            } catch {
                failed.append(name)
                FileHandle.standardError.write(Data("hop-bench: \(name) failed: \(error)\n".utf8))
            }
            try? FileManager.default.removeItem(at: folder)
        }
        printTable(figures)
        print("")
        for figure in figures { print(figure.line) }
        if !failed.isEmpty { throw ExitCode.failure }
    }

    private func runChild(_ name: String, folder: URL) throws -> [Figure] {
        try Scenarios.runScenarioProcess(name, folder: folder, quick: quick)
    }

    private func printTable(_ figures: [Figure]) {
        let rows = figures.map { figure -> [String] in
            var verdict = ""
            if let target = Self.targets[figure.name] {
                if let floor = target.atLeast {
                    verdict =
                        figure.value >= floor ? "met (≥ \(Figure.format(floor)))" : "MISSED (≥ \(Figure.format(floor)))"
                }
                if let ceiling = target.atMost {
                    verdict =
                        figure.value <= ceiling
                        ? "met (≤ \(Figure.format(ceiling)))" : "MISSED (≤ \(Figure.format(ceiling)))"
                }
            }
            return [figure.name, Figure.format(figure.value), figure.unit, verdict]
        }
        let header = ["figure", "value", "unit", "target"]
        let widths = (0..<header.count).map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { index, cell in
                index == 1
                    ? String(repeating: " ", count: widths[index] - cell.count) + cell
                    : cell + String(repeating: " ", count: widths[index] - cell.count)
            }.joined(separator: "  ").trimmingCharacters(in: .whitespaces)
        }
        print(line(header))
        print(line(widths.map { String(repeating: "-", count: $0) }))
        for row in rows { print(line(row)) }
    }
}
