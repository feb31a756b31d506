#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One entry of a run's append-only hop history.
public struct HistoryEntry: Sendable, Equatable, Codable {
    /// The run the entry belongs to.
    public var runID: Int64
    /// 1, 2, 3… within the run.
    public var seq: Int64
    /// What the entry records.
    public var kind: HistoryKind
    /// The step (hop, unhop, transition, error) or the decision or effect name.
    public var step: String?
    /// The hop's token (hop, unhop).
    public var token: String?
    /// JSON: an unhop's output or a decision's value; plain text for errors and notes.
    public var value: String?
    /// When it was committed.
    public var at: Date
}

extension HistoryEntry {
    /// An entry as recorded elsewhere (a test's fixture, another database's export).
    package static func recorded(
        runID: Int64, seq: Int64, kind: HistoryKind, step: String?, token: String? = nil, value: String?,
        at: Date = Date(timeIntervalSince1970: 0)
    ) -> HistoryEntry {
        HistoryEntry(runID: runID, seq: seq, kind: kind, step: step, token: token, value: value, at: at)
    }
}
