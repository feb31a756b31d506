/// How a loop that tries the database at every turn says that it fails: the first failure at
/// once, then one line every ``every`` with how many failed since, and one line when it succeeds
/// again. The watch polls twenty times a second: an outage logged at every poll buried
/// everything else in the journal (72,000 lines an hour).
struct RepeatedFailures {
    /// What to say now about a failure.
    enum Report: Equatable {
        /// The first failure since the last success.
        case first
        /// `failures` more failed since the last line.
        case still(failures: Int)
    }

    /// The shortest time between two lines about the same outage.
    let every: Duration
    /// Failures since the last success, and when the first of them came (`nil`: no failure).
    private var failures = 0
    private var since: ContinuousClock.Instant?
    /// Failures since the last line, and when that line was said.
    private var unsaid = 0
    private var lastSaid: ContinuousClock.Instant?

    init(every: Duration) { self.every = every }

    /// Notes a failure at `now`: what to say, or `nil` when the last line was said too recently.
    mutating func failed(at now: ContinuousClock.Instant) -> Report? {
        failures += 1
        guard let lastSaid else {
            since = now
            lastSaid = now
            return .first
        }
        unsaid += 1
        guard now - lastSaid >= every else { return nil }
        self.lastSaid = now
        defer { unsaid = 0 }
        return .still(failures: unsaid)
    }

    /// Notes a success at `now`: how many failed in a row and for how long, when it ends an
    /// outage; `nil` otherwise.
    mutating func succeeded(at now: ContinuousClock.Instant) -> (failures: Int, lasted: Duration)? {
        guard let since else { return nil }
        defer { self = RepeatedFailures(every: every) }
        return (failures, now - since)
    }
}
