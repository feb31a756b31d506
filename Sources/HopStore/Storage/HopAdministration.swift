import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// What an operator's tool (`hopctl`) needs of a database beyond what an engine does: listing
/// runs and flows, the hop graph, patches, first-use flags and facts, and moving a whole
/// deployment from one database to another. Both backends implement it, with the same answers.
package protocol HopAdministration: HopStorage {
    /// The schema version of the database (the newest migration applied).
    var schemaVersion: Int { get }

    /// The newest run of each (flow, subject), by flow and subject, at most `limit`: optionally
    /// only one flow's or one subject's, and only those whose newest run has `status`.
    func runs(flow: String?, subject: String?, status: RunStatus?, limit: Int) async throws -> [RunRecord]
    /// The names of the flows that have runs here, in order.
    func flowNames() async throws -> [String]
    /// The runs of `flow` after run `after`, for every subject, oldest first, at most `limit`: a
    /// page of every run of the flow, for a reader that must not hold them all at once.
    func allRuns(flow: String, after: Int64, limit: Int) async throws -> [RunRecord]
    /// The entries of run `runID` after entry `after` and up to entry `through`, in order, at most
    /// `limit`: a page of a history too long to hold at once (a run that went round a loop for
    /// years).
    func history(runID: Int64, after: Int64, through: Int64, limit: Int) async throws -> [HistoryEntry]
    /// The sequence number of the last entry of each of `runIDs` (how many entries it has), by
    /// run; 0 for a run without entries.
    func historyLengths(runIDs: [Int64]) async throws -> [Int64: Int64]
    /// The hops observed in all runs of `flow`, with their counts.
    func hopGraph(flow: String) async throws -> [HopEdge]
    /// The patches whose new branch runs of `flow` took.
    func patches(flow: String) async throws -> [PatchUsage]
    /// The unfinished runs of `flow` whose history has no marker of `patch`.
    func runsWithoutPatch(flow: String, patch: String) async throws -> [RunRecord]
    /// The features `subject` has used, by name.
    func firstUseFlags(subject: String) async throws -> [FirstUseFlag]
    /// Makes `features` first-use again for `subject`; returns how many were marked used.
    func resetFirstUse(subject: String, features: [String]) async throws -> Int
    /// Makes `feature` first-use again for `subject` only while its flag is the one set at
    /// `usedAt` (to the second, as `hopctl first-use list` shows it), so that a retried reset
    /// never clears the flag a flow set again after the first; returns how many flags were
    /// cleared (0 when none is set). Refused (`.refused`), changing nothing, for a flag set at
    /// another time.
    func resetFirstUse(subject: String, feature: String, ifUsedAt usedAt: Date) async throws -> Int
    /// Makes every feature first-use again for `subject`; returns how many flags were cleared.
    func resetAllFirstUse(subject: String) async throws -> Int

    /// Everything the database holds — runs, histories, first-use flags, sessions and facts —
    /// read as one consistent snapshot while daemons go on writing, and handed to `body` a part
    /// at a time, in ``SnapshotPart``'s order: only a part is held at once, however large the
    /// database. The read stays open, on a connection of its own, until `body` has taken the
    /// last part. An error of `body` ends the read and is thrown as it is.
    func snapshot(_ body: @escaping SnapshotPartTaker) async throws
    /// Writes what `parts` hands to its `write` function, part by part in ``SnapshotPart``'s
    /// order, into this database in one transaction: all of it or, when either throws, nothing.
    /// Refused (`.refused`) unless the database holds no run, flag, session or fact. Runs keep
    /// their ids; no run is held by an engine afterwards (the engines of the source are not this
    /// database's), so an engine registered for a running run's flow takes it. The transaction
    /// stays open until `parts` returns; this store's connection is the copy's meanwhile. A
    /// server's transaction may be run again from the start (after a deadlock, or a connection
    /// lost before its commit): `parts` is then called again and must hand out everything again.
    func restore(
        _ parts: @escaping @Sendable (_ write: @escaping SnapshotPartTaker) async throws -> Void
    ) async throws
}

/// What takes the parts of a snapshot: the `body` of ``HopAdministration/snapshot(_:)``, and
/// the `write` function a restore hands to its `parts`.
package typealias SnapshotPartTaker = @Sendable (SnapshotPart) async throws -> Void

/// A few thousand rows of one table of a Hop database, as ``HopAdministration/snapshot(_:)``
/// hands them out and ``HopAdministration/restore(_:)`` takes them: the runs first (by id), then
/// the history (by run and seq), the first-use flags, the sessions and the facts.
package enum SnapshotPart: Sendable {
    case runs([RunRecord])
    case history([HistoryEntry])
    case firstUse([(subject: String, flag: FirstUseFlag)])
    case sessions([StoredSession])
    case facts([(subject: String, fact: Fact)])

    /// The most rows a part holds.
    package static let rowsPerPart = 5000

    /// How many rows it holds.
    package var count: Int {
        switch self {
        case .runs(let rows): rows.count
        case .history(let rows): rows.count
        case .firstUse(let rows): rows.count
        case .sessions(let rows): rows.count
        case .facts(let rows): rows.count
        }
    }
}

/// Whether a restore's transaction is still open: a part handed in after it ended is refused.
package final class OpenCopy: Sendable {
    private let open = Atomic(true)

    package init() {}

    package var isOpen: Bool { open.load(ordering: .acquiring) }

    package func end() { open.store(false, ordering: .releasing) }
}

/// The whole content of a Hop database, held at once: what tests and benchmarks write with
/// `HopAdministration.restore(_:)`.
package struct HopSnapshot: Sendable {
    /// Every run, by id.
    package var runs: [RunRecord]
    /// Every history entry, by run and seq.
    package var history: [HistoryEntry]
    /// Every first-use flag.
    package var firstUse: [(subject: String, flag: FirstUseFlag)]
    /// Every stored session, its token included.
    package var sessions: [StoredSession]
    /// Every fact.
    package var facts: [(subject: String, fact: Fact)]

    package init(
        runs: [RunRecord], history: [HistoryEntry], firstUse: [(subject: String, flag: FirstUseFlag)],
        sessions: [StoredSession], facts: [(subject: String, fact: Fact)]
    ) {
        self.runs = runs
        self.history = history
        self.firstUse = firstUse
        self.sessions = sessions
        self.facts = facts
    }

    /// Hands its rows to `write` as parts, in ``SnapshotPart``'s order.
    func write(to write: (SnapshotPart) async throws -> Void) async throws {
        func each<Row>(_ rows: [Row], _ part: ([Row]) -> SnapshotPart) async throws {
            for start in stride(from: 0, to: rows.count, by: SnapshotPart.rowsPerPart) {
                try await write(part(Array(rows[start..<min(start + SnapshotPart.rowsPerPart, rows.count)])))
            }
        }
        try await each(runs, SnapshotPart.runs)
        try await each(history, SnapshotPart.history)
        try await each(firstUse, SnapshotPart.firstUse)
        try await each(sessions, SnapshotPart.sessions)
        try await each(facts, SnapshotPart.facts)
    }
}

extension HopAdministration {
    /// Writes `snapshot` into this database in one transaction, as a restore of parts does:
    /// all of it or nothing, and only into a database that holds no data.
    package func restore(_ snapshot: HopSnapshot) async throws {
        try await restore { write in try await snapshot.write(to: write) }
    }

    /// Every run of `flow`, for every subject, oldest first.
    package func allRuns(flow: String) async throws -> [RunRecord] {
        try await allRuns(flow: flow, after: .min, limit: .max)
    }

    /// The newest run of each (flow, subject), whatever its status, by flow and subject, at most `limit`.
    package func runs(flow: String?, subject: String?, limit: Int) async throws -> [RunRecord] {
        try await runs(flow: flow, subject: subject, status: nil, limit: limit)
    }
}
