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
