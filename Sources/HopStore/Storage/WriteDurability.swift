/// When a write must be durable.
///
/// A run's records need not each be durable on their own: a record only has to be durable before
/// something that depends on it becomes visible. The engine asks for `.coalesced` for a run's
/// decisions, patch markers, effects, its own steps' unhops and its completion, and for `.now`
/// for what starts work or waits (a hop, parking on an external step, a durable timer), for every
/// write from outside the engine and for every change of ownership.
package enum WriteDurability: Sendable {
    /// Committed before the call returns (with the writes of other callers that arrived meanwhile).
    case now
    /// Applied before the call returns — every later read and write of this storage sees it —
    /// and committed with the next `.now` write, or ``HopStore/Options/commitDelay`` later at
    /// the latest. A process that dies before that loses it, and every write applied after it,
    /// together: what is durable is always a prefix of what was applied.
    case coalesced
}
