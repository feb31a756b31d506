#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A stored change that finishes a parked step without an explicit unhop.
public enum WakeCondition: String, Sendable, Codable {
    /// Storing a session for the run's subject unhops the step (a login step).
    case sessionStored = "session-stored"
    /// Removing the session of the run's subject (a logout) ends the step with a re-route
    /// (e.g. a main step, so that the flow goes back through login).
    case sessionRemoved = "session-removed"
}
