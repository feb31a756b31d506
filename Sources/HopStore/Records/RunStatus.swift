#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Where a run stands.
public enum RunStatus: String, Sendable, Codable, CaseIterable {
    /// Being executed, or ready to be: an engine will (re)enter it.
    case running
    /// Waiting on an external step's unhop; no engine holds it in memory.
    case parked
    /// The flow body returned.
    case completed
    /// A step failed after its retries.
    case failed
    /// Cancelled by an operator or the API; never advances again.
    case cancelled
    /// The flow code asked for a different path than the history recorded.
    case diverged

    /// Whether the run can still advance.
    public var isUnfinished: Bool { self == .running || self == .parked }
}
