/// The run a caller of a start expects to be the subject's latest run of the flow, so that the
/// same start tried again (after a timeout, a lost answer) starts no second run, even once the
/// first one it started has finished (`hopctl start --latest`).
public enum ExpectedLatestRun: Sendable, Equatable {
    /// The subject has no run of the flow yet.
    case noRun
    /// Run `id` is the subject's latest run of the flow.
    case run(Int64)
}
