import HopStore

/// What an engine reports to its observer, synchronously, as it happens.
///
/// Meant for progress displays, tracing and tests. The observer runs on the engine's path:
/// keep it short and never block in it. A later release may add cases: a `switch` over an
/// event has a `default`.
public enum EngineEvent: Sendable {
    /// About to commit a history entry of `kind` for `step` (a step, decision or effect name).
    case willRecord(run: RunRef, kind: HistoryKind, step: String?)
    /// A history entry was committed.
    case recorded(run: RunRef, event: HistoryEntry)
    /// The engine started executing a run; `replaying` counts the history entries it will replay.
    case executing(run: RunRef, replaying: Int)
    /// The engine stopped executing a run: it is parked, finished, or the engine is shutting down
    /// (then told once the run's release ended: see ``HopEngine/stopExecuting()``).
    case settled(run: RunRecord)
    /// The running engine has resumed the unfinished runs it found and watches for changes
    /// (the moment a daemon reports itself ready, e.g. systemd's `READY=1`).
    case ready
    /// The database failed the engine's own calls (its start-up, a poll of its watch): a busy
    /// lock, an I/O error, a PostgreSQL server gone. Reported once as an outage begins, however
    /// many calls fail while it lasts; the engine tries again at each poll, and no run moves on
    /// meanwhile. ``databaseAnswers`` follows once the database answers again. The metric
    /// `hop_database_up` reads 0 meanwhile.
    case databaseFailing(HopError)
    /// The database answers the engine again after ``databaseFailing(_:)``: the runs go on.
    case databaseAnswers
}
