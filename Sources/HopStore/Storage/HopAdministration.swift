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
    /// read as one consistent snapshot while daemons go on writing.
    func snapshot() async throws -> HopSnapshot
    /// Writes `snapshot` into this database in one transaction: all of it or, when it throws,
    /// nothing. Refused (`.refused`) unless the database holds no run, flag, session or fact.
    /// Runs keep their ids; no run is held by an engine afterwards (the engines of the source
    /// are not this database's), so an engine registered for a running run's flow takes it.
    func restore(_ snapshot: HopSnapshot) async throws
}

/// The whole content of a Hop database, as moved by `hopctl copy`.
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

    /// Whether the snapshot holds nothing at all.
    package var isEmpty: Bool {
        runs.isEmpty && history.isEmpty && firstUse.isEmpty && sessions.isEmpty && facts.isEmpty
    }
}

extension HopAdministration {
    /// Every run of `flow`, for every subject, oldest first.
    package func allRuns(flow: String) async throws -> [RunRecord] {
        try await allRuns(flow: flow, after: .min, limit: .max)
    }

    /// The newest run of each (flow, subject), whatever its status, by flow and subject, at most `limit`.
    package func runs(flow: String?, subject: String?, limit: Int) async throws -> [RunRecord] {
        try await runs(flow: flow, subject: subject, status: nil, limit: limit)
    }
}
