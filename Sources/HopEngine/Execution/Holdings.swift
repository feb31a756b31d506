import Synchronization

/// Which runs an engine holds, shared by its executions and its watch without an actor hop.
struct Holdings: Sendable {
    /// Runs this engine claimed and is executing, each with when its lease was last taken or
    /// renewed: the moment before the engine asked for it, so that the lease in the database
    /// ends no sooner than a ``HopEngine/Configuration/leaseDuration`` after it.
    var held: [Int64: ContinuousClock.Instant] = [:]
    /// Held runs that another engine took over (this one was frozen past its lease), or whose
    /// lease lapsed here (``HopEngine/LapsedLeases/stopExecuting``): their executions are
    /// cancelled and write nothing more.
    var lost: Set<Int64> = []
    /// Runs that a caller waits to see settle (``HopEngine/settled(runID:)``): their execution
    /// reads the run as it ended, where it ran, for the engine to hand over.
    var awaited: Set<Int64> = []
    /// When the last lease renewal was asked for: it renews the runs held then, and no other.
    var renewalAsked: ContinuousClock.Instant?
    /// This engine let a run go that it could not execute because the database failed: the
    /// watch looks for runs to resume at its next poll, not a third of a lease later.
    var letGoAfterAFailure = false

    /// Marks held run `runID` lost; `false` when it was not held or already marked.
    mutating func lose(_ runID: Int64) -> Bool {
        held[runID] != nil && lost.insert(runID).inserted
    }

    mutating func settled(_ runID: Int64) {
        held[runID] = nil
        lost.remove(runID)
    }

    /// The held runs whose leases a renewal renews: those not lost.
    var renewable: [Int64] { lost.isEmpty ? Array(held.keys) : held.keys.filter { !lost.contains($0) } }

    /// The runs a renewal asked for at `instant` renews (``renewable``).
    mutating func renewing(at instant: ContinuousClock.Instant) -> [Int64] {
        renewalAsked = instant
        return renewable
    }

    /// Holds run `runID`, whose lease this engine asked for at `leasedAt`. Returns whether a
    /// renewal asked for more than `interval` (a third of a lease) after it left it out (the
    /// claim was answered after that renewal read the runs to renew): the next renewal, due
    /// `interval` after that one, might then come after the lease is taken as lapsed, and must
    /// go at once. A claim answered after a renewal asked for sooner (a resume's, in the
    /// milliseconds its batch takes) is renewed with the others, in time.
    mutating func hold(_ runID: Int64, leasedAt: ContinuousClock.Instant, renewedEvery interval: Duration) -> Bool {
        held[runID] = leasedAt
        guard let renewalAsked else { return false }
        return renewalAsked - leasedAt > interval
    }

    /// Records that the leases of `runIDs` were renewed by a renewal asked for at `instant`.
    mutating func renewed(_ runIDs: some Sequence<Int64>, at instant: ContinuousClock.Instant) {
        for runID in runIDs {
            if let since = held[runID], since < instant { held[runID] = instant }
        }
    }

    /// When the oldest lease of a held run not lost was taken or last renewed.
    var oldestLease: ContinuousClock.Instant? {
        held.lazy.filter { !lost.contains($0.key) }.map(\.value).min()
    }

    /// Marks lost the held runs whose lease was taken or last renewed before `cutoff`; returns them.
    mutating func lapse(before cutoff: ContinuousClock.Instant) -> [Int64] {
        let due = held.compactMap { $0.value < cutoff && !lost.contains($0.key) ? $0.key : nil }
        lost.formUnion(due)
        return due
    }
}

/// A run's history read in bulk, handed to the run's executor, which takes it out: nothing
/// keeps it alive after the run's replay has let it go.
final class ClaimedHistory: Sendable {
    private let history: Mutex<[HistoryEntry]?>
    /// When the engine asked for the run's lease.
    let leasedAt: ContinuousClock.Instant

    init(_ claim: Claim) {
        history = Mutex(claim.history)
        leasedAt = claim.leasedAt
    }

    func take() -> [HistoryEntry]? { history.withLock { $0.take() } }
}

/// What an engine that has just claimed a run hands its execution: the run's history, and
/// when the engine asked for the run's lease.
struct Claim: Sendable {
    var history: [HistoryEntry]
    var leasedAt: ContinuousClock.Instant
}

/// Why a flow body stopped early without failing: the engine's own control flow.
/// A flow body must let these errors pass (never catch and swallow what `hop` throws).
enum Suspension: Error {
    /// The run is parked on an external step; it resumes when the step is unhopped.
    case parked(step: String)
    /// The run was finished elsewhere (cancelled, restarted) or taken over; it never advances here again.
    case finished
    /// The step that returned here was ended from outside before its unhop was written (its
    /// token, through `engine.unhop`): the run is executed again, from its history.
    case endedElsewhere(step: String)
    /// The run's history does not end at the last entry this execution read or recorded
    /// (`expected`) but at `found`: the database lost the execution's last commits, or another
    /// writer moved the history on. The run is executed again, from the history the database holds.
    case historyMoved(expected: Int64, found: Int64)
}
