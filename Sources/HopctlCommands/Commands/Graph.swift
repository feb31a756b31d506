import ArgumentParser
import HopStore

struct Graph: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "graph",
        abstract: "The graph of hops observed in all runs of a flow, edges labelled with how often they were taken.")

    enum Format: String, ExpressibleByArgument, CaseIterable {
        case mermaid, dot
    }

    @OptionGroup var global: ReadOptions
    @OptionGroup var output: OutputOptions

    @Option(help: ArgumentHelp("The flow.", valueName: "flow"))
    var flow: String

    @Option(help: "mermaid (for Markdown, the default) or dot (for Graphviz).")
    var format: Format?

    func validate() throws {
        try checkIdentifier(flow, as: "flow name")
        if output.json, format != nil { throw ValidationError("--json and --format conflict: give one of them") }
    }

    func run() async throws {
        let store = try await global.openForReading()
        let edges = try await store.hopGraph(flow: flow)
        if output.json { return try Output.json(edges.map { EdgeJSON(from: $0.from, to: $0.to, count: $0.count) }) }
        guard !edges.isEmpty else {
            throw HopError(
                .notFound, operation: "graph", path: store.location, reason: "no run of flow '\(flow)' has hopped yet",
                hint: "Check the flow name with `hopctl status`")
        }
        switch format ?? .mermaid {
        case .mermaid: Output.line(mermaid(edges))
        case .dot: Output.line(dot(edges))
        }
    }

    /// Node ids are generated (n1, n2, …) so that any step name is a safe label.
    private func mermaid(_ edges: [HopEdge]) -> String {
        var ids: [String: String] = [:]
        var lines = ["flowchart LR", "    start((start))"]
        func node(_ step: String) -> String {
            if let id = ids[step] { return id }
            let id = "n\(ids.count + 1)"
            ids[step] = id
            let label = Output.printable(step).replacing("\"", with: "#quot;")
            lines.append("    \(id)[\"\(label)\"]")
            return id
        }
        var arrows: [String] = []
        for edge in edges {
            let from = edge.from.map(node) ?? "start"
            arrows.append("    \(from) -->|\(edge.count)| \(node(edge.to))")
        }
        return (lines + arrows).joined(separator: "\n")
    }

    private func dot(_ edges: [HopEdge]) -> String {
        func quoted(_ text: String) -> String {
            "\""
                + Output.printable(text).replacing("\\", with: "\\\\").replacing(
                    "\"", with: "\\\"") + "\""
        }
        var lines = ["digraph \(quoted(flow)) {", "    rankdir=LR;", "    \"(start)\" [shape=circle];"]
        for edge in edges {
            lines.append(
                "    \(edge.from.map(quoted) ?? "\"(start)\"") -> \(quoted(edge.to)) [label=\"\(edge.count)\"];")
        }
        lines.append("}")
        return lines.joined(separator: "\n")
    }
}
