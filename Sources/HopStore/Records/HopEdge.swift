#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// An edge of the hop graph of a flow: how many times runs went from one step to the next.
public struct HopEdge: Sendable, Equatable, Codable {
    /// `nil` for the start of a run.
    public var from: String?
    /// The step entered.
    public var to: String
    /// How many times runs took this edge.
    public var count: Int
}

extension HopEdge {
    /// An edge as counted by a database.
    package static func counted(from: String?, to: String, count: Int) -> HopEdge {
        HopEdge(from: from, to: to, count: count)
    }
}

/// Counts the edges of a hop graph from hops read run by run, each run's in order.
package struct HopGraphCount {
    private struct Edge: Hashable {
        var from: String?
        var to: String
    }

    private var counts: [Edge: Int] = [:]
    private var run: Int64?
    private var previous: String?

    package init() {}

    /// Counts the hop of `run` to `step`: an edge from the run's previous hop, or from its start.
    package mutating func count(run: Int64, step: String) {
        if run != self.run {
            self.run = run
            previous = nil
        }
        counts[Edge(from: previous, to: step), default: 0] += 1
        previous = step
    }

    /// The counted edges, the most taken first, then by their steps (a run's start first).
    package var edges: [HopEdge] {
        counts.map { HopEdge(from: $0.key.from, to: $0.key.to, count: $0.value) }.sorted { a, b in
            if a.count != b.count { return a.count > b.count }
            switch (a.from, b.from) {
            case let (x?, y?) where x != y: return x < y
            case (nil, _?): return true
            case (_?, nil): return false
            default: return a.to < b.to
            }
        }
    }
}
