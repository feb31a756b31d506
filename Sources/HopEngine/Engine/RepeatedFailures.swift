import Logging

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

extension RepeatedFailures {
    /// What a loop says about an outage, in its own words: its first failure, a failure since,
    /// and its end.
    struct Lines {
        let first: Logger.Message
        let still: Logger.Message
        let over: Logger.Message
    }

    /// Notes `error`, now, and logs what ``failed(at:)`` says to.
    mutating func log(_ error: any Error, to logger: Logger, _ lines: Lines) {
        switch failed(at: .now) {
        case .first: logger.error(lines.first, metadata: ["hop.error": "\(error)"])
        case .still(let count):
            logger.error(lines.still, metadata: ["hop.error": "\(error)", "hop.failures": "\(count)"])
        case nil: break
        }
    }

    /// Notes a success, now, and logs the end of an outage (a notice with how many failed and
    /// for how long) when it ends one.
    mutating func logSuccess(to logger: Logger, _ lines: Lines) {
        guard let outage = succeeded(at: .now) else { return }
        logger.notice(lines.over, metadata: ["hop.failures": "\(outage.failures)", "hop.outage": "\(outage.lasted)"])
    }
}
