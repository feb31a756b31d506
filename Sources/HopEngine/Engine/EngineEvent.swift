import HopStore

/// What an engine reports to its observer, synchronously, as it happens.
///
/// Meant for progress displays, tracing and tests. The observer runs on the engine's path:
/// keep it short and never block in it.
public enum EngineEvent: Sendable {
    /// About to commit a history entry of `kind` for `step` (a step, decision or effect name).
    case willRecord(run: RunRef, kind: HistoryKind, step: String?)
    /// A history entry was committed.
    case recorded(run: RunRef, event: HistoryEntry)
    /// The engine started executing a run; `replaying` counts the history entries it will replay.
    case executing(run: RunRef, replaying: Int)
    /// The engine stopped executing a run: it is parked, finished, or the engine is shutting down.
    case settled(run: RunRecord)
    /// The running engine has resumed the unfinished runs it found and watches for changes
    /// (the moment a daemon reports itself ready, e.g. systemd's `READY=1`).
    case ready
}
