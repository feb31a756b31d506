/// How often a failing step is tried, and how long to wait between tries.
public struct RetryPolicy: Sendable, Equatable {
    /// Tries in all, the first included; at least 1.
    public var maxAttempts: Int
    /// Wait before the second try; doubled for each further try, up to `maxBackoff`.
    public var initialBackoff: Duration
    /// The longest wait between two tries.
    public var maxBackoff: Duration

    public init(maxAttempts: Int, initialBackoff: Duration = .milliseconds(100), maxBackoff: Duration = .seconds(30)) {
        self.maxAttempts = max(1, maxAttempts)
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }

    /// One try: a throwing step fails the run.
    public static let none = RetryPolicy(maxAttempts: 1)

    func backoff(afterAttempt attempt: Int) -> Duration {
        var wait = initialBackoff
        for _ in 1..<max(1, attempt) where wait < maxBackoff { wait *= 2 }
        return min(wait, maxBackoff)
    }
}
