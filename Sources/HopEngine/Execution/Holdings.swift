import Synchronization

/// Which runs an engine holds, shared by its executions and its watch without an actor hop.
struct Holdings: Sendable {
    /// Runs this engine claimed and is executing.
    var held: Set<Int64> = []
    /// Held runs that another engine took over (this one was frozen past its lease): their
    /// executions are cancelled and write nothing more.
    var lost: Set<Int64> = []
    /// Runs that a caller waits to see settle (``HopEngine/settled(runID:)``): their execution
    /// reads the run as it ended, where it ran, for the engine to hand over.
    var awaited: Set<Int64> = []
    /// This engine let a run go that it could not execute because the database failed: the
    /// watch looks for runs to resume at its next poll, not a third of a lease later.
    var letGoAfterAFailure = false

    /// Marks held run `runID` lost; `false` when it was not held or already marked.
    mutating func lose(_ runID: Int64) -> Bool {
        held.contains(runID) && lost.insert(runID).inserted
    }

    mutating func settled(_ runID: Int64) {
        held.remove(runID)
        lost.remove(runID)
    }
}

/// A run's history read in bulk, handed to the run's executor, which takes it out: nothing
/// keeps it alive after the run's replay has let it go.
final class ClaimedHistory: Sendable {
    private let history: Mutex<[HistoryEntry]?>

    init(_ history: [HistoryEntry]) { self.history = Mutex(history) }

    func take() -> [HistoryEntry]? { history.withLock { $0.take() } }
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
