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
    /// Whether ``deadline`` goes by this machine's wall clock as it now stands, which NTP may
    /// step later (a board without a real-time clock boots with a stale time): a file's deadline
    /// written in an earlier boot, or where the boot is unknown. A deadline of this boot is kept
    /// by the uptime clock, and a server's by the server's clock. How this machine reads the
    /// entry, not part of it: neither compared nor encoded. (Here, beside `kind`, it takes no
    /// room: the padding after `kind` holds it.)
    package var deadlineGoesByTheWallClock = false
    /// The step (hop, unhop, transition, error) or the decision or effect name.
    public var step: String?
    /// The hop's token (hop, unhop).
    public var token: String?
    /// JSON: an unhop's output or a decision's value; plain text for errors and notes.
    public var value: String?
    /// When it was committed.
    public var at: Date

    private enum CodingKeys: String, CodingKey {
        case runID, seq, kind, step, token, value, at
    }

    public static func == (lhs: HistoryEntry, rhs: HistoryEntry) -> Bool {
        lhs.runID == rhs.runID && lhs.seq == rhs.seq && lhs.kind == rhs.kind && lhs.step == rhs.step
            && lhs.token == rhs.token && lhs.value == rhs.value && lhs.at == rhs.at
    }
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

extension HistoryEntry {
    /// The value recording a deadline of `milliseconds` since the Unix epoch: a timer's is the
    /// number, a hop's `{"deadline": milliseconds}` (a hop with a timeout).
    package static func deadlineValue(_ kind: HistoryKind, milliseconds: Int64) -> String {
        kind == .hop ? #"{"deadline":\#(milliseconds)}"# : "\(milliseconds)"
    }

    /// The deadline a timer or a hop with a timeout records; `nil` for other entries.
    package var deadline: Date? {
        guard let value else { return nil }
        let milliseconds: Int64?
        switch kind {
        case .timer:
            milliseconds = Int64(value)
        case .hop:
            struct Stored: Decodable { var deadline: Int64 }
            milliseconds = try? JSONDecoder().decode(Stored.self, from: Data(value.utf8)).deadline
        default:
            milliseconds = nil
        }
        return milliseconds.map(Clock.date)
    }
}
