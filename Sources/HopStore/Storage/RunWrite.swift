#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One record an engine writes for a run it executes. ``HopStorage/record(_:runID:owner:durability:)``
/// applies one or several of them in order as one write, fenced by the run's owner: the one
/// method through which a backend records what a run does (the convenience methods of
/// `HopStorage`, `recordHop` and the rest, are built on it).
package enum RunWrite: Sendable {
    /// A hop to `step`, after a transition from `from`; a parking step parks the run and gives
    /// up its lease; with `deadline`, the step times out then.
    case hop(step: String, from: String?, parks: Bool, wakeOn: WakeCondition?, deadline: Date?)
    /// The end of the step in flight, if `token` is its token, with its output as JSON.
    case unhop(token: String, output: String?)
    /// The value, as JSON, that a condition had when the run read it.
    case decision(name: String, value: String)
    /// The run took the new branch of patch `name`.
    case patch(name: String)
    /// A durable sleep until `deadline`.
    case timer(name: String, deadline: Date)
    /// The run's subject used `feature` (the first-use flag is set in the same write).
    case markUsed(feature: String)
    /// The flow body returned: the run is completed.
    case complete

    /// The kind of the history entry the write appends.
    package var kind: HistoryKind {
        switch self {
        case .hop: .hop
        case .unhop: .unhop
        case .decision: .decision
        case .patch: .patch
        case .timer: .timer
        case .markUsed: .effect
        case .complete: .complete
        }
    }

    /// The name the entry records in its step column, where the write carries it: the step of
    /// a hop, a decision's, patch's or timer's name, an effect's; `nil` for an unhop (its step is
    /// the run's, known to the store) and a completion.
    package var name: String? {
        switch self {
        case .hop(let step, _, _, _, _): step
        case .decision(let name, _), .patch(let name), .timer(let name, _): name
        case .markUsed(let feature): markUsedEffectName(feature)
        case .unhop, .complete: nil
        }
    }

    /// Whether the write needs a running run (every write but an unhop, which ends a parked
    /// run's step too).
    package var needsRunningRun: Bool {
        if case .unhop = self { return false }
        return true
    }

    /// Whether the write parks the run until a session of its subject is stored or removed
    /// (a login or logout ends the step): on a server, the write is ordered with those.
    package var parksUntilASessionChange: Bool {
        if case .hop(_, _, true, .some, _) = self { return true }
        return false
    }

    /// Whether the write parks the run with a deadline (a step's timeout): it comes due then.
    package var parksWithADeadline: Bool {
        if case .hop(_, _, true, _, .some) = self { return true }
        return false
    }

    /// What the write does, for messages: "hop run 5 to login".
    package func operation(runID: Int64) -> String {
        switch self {
        case .hop(let step, _, _, _, _): "hop run \(runID) to \(step)"
        case .unhop: "unhop run \(runID)"
        case .decision(let name, _): "record decision \(name) of run \(runID)"
        case .patch(let name): "record patch \(name) of run \(runID)"
        case .timer(let name, _): "record timer \(name) of run \(runID)"
        case .markUsed(let feature): "mark \(feature) used by run \(runID)"
        case .complete: "complete run \(runID)"
        }
    }

    /// Checks the names and JSON values the write carries.
    /// - Throws: ``HopError`` of kind `.invalidInput`, naming the value and the rule.
    package func validate(path: String) throws {
        switch self {
        case .hop(let step, _, _, _, _): try Identifier.validate(step, as: "step name", path: path)
        case .unhop(_, let output?): try JSONText.validate(output, as: "step output", path: path)
        case .unhop: break
        case .decision(let name, let value):
            try Identifier.validate(name, as: "decision name", path: path)
            try JSONText.validate(value, as: "decision value", path: path)
        case .patch(let name): try Identifier.validate(name, as: "patch name", path: path)
        case .timer(let name, _): try Identifier.validate(name, as: "timer name", path: path)
        case .markUsed(let feature): try Identifier.validate(feature, as: "feature name", path: path)
        case .complete: break
        }
    }
}
