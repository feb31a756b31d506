#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// What a history entry records.
public enum HistoryKind: String, Sendable, Codable, CaseIterable {
    /// The run entered a step.
    case hop
    /// The step in flight finished, with an optional JSON output.
    case unhop
    /// The step in flight was ended by its deadline.
    case timeout
    /// The step in flight was ended by a change of stored state (e.g. a logout), sending the run on another path.
    case reroute
    /// A durable sleep; its value is the deadline in milliseconds since the Unix epoch.
    case timer
    /// A condition was read; its JSON value is replayed on resume.
    case decision
    /// A change the flow made to stored state (e.g. marking a feature used), applied exactly once.
    case effect
    /// A transition hook ran between two steps.
    case transition
    /// A step threw; the message is kept.
    case error
    /// The run was cancelled.
    case cancel
    /// The run was ended so that a new run starts over.
    case restart
    /// The flow body returned.
    case complete
    /// The run failed for good.
    case fail
    /// The flow code no longer matches the history.
    case diverge
    /// Another engine incarnation claimed the run: the step holds its label, the value
    /// `{"from": previous incarnation, "to": new incarnation}`.
    case takeover
    /// The run took the new branch of `flow.patched(name)`; the step holds the patch's name.
    /// Replay takes the new branch where the marker stands and the old one where none does.
    case patch
    /// The run was forked: in the old run, `{"to": new run, "through": entry}`; first in the new
    /// run, `{"from": old run, "through": entry}` (the entries it took over follow).
    case fork

    /// Whether the entry ends the step in flight (an unhop, a timeout or a re-route).
    public var endsStep: Bool { self == .unhop || self == .timeout || self == .reroute }

    /// Whether replay matches this entry against the flow code (the rest is commentary).
    public var isReplayed: Bool {
        switch self {
        case .hop, .unhop, .timeout, .reroute, .decision, .effect, .timer, .patch: true
        default: false
        }
    }
}
