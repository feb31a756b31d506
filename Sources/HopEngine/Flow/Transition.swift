/// A hop about to happen: CLHoppingViewController's custom transition block (from, to, completion).
/// The hop is recorded as entered only once the transition hook returns.
public struct Transition: Sendable {
    /// The flow name.
    public let flow: String
    /// Whom the run is for.
    public let subject: String
    /// The run id.
    public let runID: Int64
    /// The step the run last entered, `nil` at the start of the run.
    public let from: String?
    /// The step about to be entered.
    public let to: String
}
