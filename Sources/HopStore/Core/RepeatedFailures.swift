import Logging

/// How a loop that tries the database at every turn says that it fails: the first failure at
/// once, then one line every ``every`` with how many failed since, and one line when it succeeds
/// again. The engine's watch polls twenty times a second: an outage logged at every poll buried
/// everything else in the journal (72,000 lines an hour). The engine's loops and PostgreSQL's
/// reconnecting connections (liveness lock, notifications) say their outages this way.
package struct RepeatedFailures {
    /// What to say now about a failure.
    package enum Report: Equatable {
        /// The first failure since the last success.
        case first
        /// `failures` more failed since the last line.
        case still(failures: Int)
    }

    /// The shortest time between two lines about the same outage.
    package let every: Duration
    /// Failures since the last success, and when the first of them came (`nil`: no failure).
    package private(set) var failures = 0
    private var since: ContinuousClock.Instant?
    /// Failures since the last line, and when that line was said.
    private var unsaid = 0
    private var lastSaid: ContinuousClock.Instant?

    /// `every`: 10 s unless a test wants another.
    package init(every: Duration = .seconds(10)) { self.every = every }

    /// Notes a failure at `now`: what to say, or `nil` when the last line was said too recently.
    package mutating func failed(at now: ContinuousClock.Instant) -> Report? {
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
    package mutating func succeeded(at now: ContinuousClock.Instant) -> (failures: Int, lasted: Duration)? {
        guard let since else { return nil }
        defer { self = RepeatedFailures(every: every) }
        return (failures, now - since)
    }
}

extension RepeatedFailures {
    /// What a loop says about an outage, in its own words and at its level: its first failure,
    /// a failure since, and its end (a notice).
    package struct Lines: Sendable {
        package let first: Logger.Message
        package let still: Logger.Message
        package let over: Logger.Message
        package let level: Logger.Level

        package init(
            first: Logger.Message, still: Logger.Message, over: Logger.Message, level: Logger.Level = .error
        ) {
            self.first = first
            self.still = still
            self.over = over
            self.level = level
        }
    }

    /// Notes `error`, now, and logs what ``failed(at:)`` says to, with `metadata` beside the error.
    /// The line's source is the caller's module, as if it had logged it itself.
    package mutating func log(
        _ error: any Error, to logger: Logger, _ lines: Lines, metadata: Logger.Metadata = [:],
        file: String = #fileID, function: String = #function, line: UInt = #line
    ) {
        let said: (message: Logger.Message, metadata: Logger.Metadata)
        switch failed(at: .now) {
        case .first: said = (lines.first, ["hop.error": "\(error)"])
        case .still(let count): said = (lines.still, ["hop.error": "\(error)", "hop.failures": "\(count)"])
        case nil: return
        }
        logger.log(
            level: lines.level, said.message, metadata: metadata.merging(said.metadata) { $1 }, file: file,
            function: function, line: line)
    }

    /// Notes a success, now, and logs the end of an outage (a notice with how many failed and
    /// for how long) when it ends one.
    package mutating func logSuccess(
        to logger: Logger, _ lines: Lines, metadata: Logger.Metadata = [:], file: String = #fileID,
        function: String = #function, line: UInt = #line
    ) {
        guard let outage = succeeded(at: .now) else { return }
        logger.notice(
            lines.over,
            metadata: metadata.merging(["hop.failures": "\(outage.failures)", "hop.outage": "\(outage.lasted)"]) { $1 },
            file: file, function: function, line: line)
    }
}
