/// Which run an event is about.
public struct RunRef: Sendable, Equatable {
    /// The run id.
    public let id: Int64
    /// The flow name.
    public let flow: String
    /// Whom the run is for.
    public let subject: String
}
