import Foundation
import HopStore
import PostgresNIO
import Synchronization

/// The server's clock as this process sees it: this machine's clock plus an offset, measured by
/// asking the server for its time and taking the middle of the round trip.
///
/// A fleet's times are judged by it (``PostgresStore/now()``): the deadlines of durable sleeps
/// and step timeouts, session expiry, the times written with each record. The machines of a fleet
/// then need not agree on the time. By each engine's own clock, a sleep or a step timeout recorded
/// by an engine whose clock was behind ended early once another engine resumed or watched it (at
/// once, when the clock was behind by more than the timeout), and late when it was ahead; an
/// engine whose clock was ahead removed sessions before they expired.
///
/// Measured when the store opens, then again in the background when a reading is older than
/// ``refreshAfter`` (the machine's clock may be stepped meanwhile). A reading whose round trip
/// took longer than ``longestRoundTrip`` (a pool busy with other work) is not used, and the next
/// is taken a second later.
final class ServerClock: Sendable {
    private struct State {
        /// The server's clock minus this machine's, in seconds.
        var offset: Double = 0
        /// When the offset was last measured (monotonic), if ever.
        var measuredAt: ContinuousClock.Instant?
        /// When the next ``now()`` measures again: ``refreshAfter`` after a reading, a second after
        /// one that failed or was not used (a busy pool is not asked again at once).
        var nextReading: ContinuousClock.Instant?
        /// Whether a measurement is in flight.
        var measuring = false
    }

    /// How old a reading may be before the next ``now()`` starts measuring again.
    static let refreshAfter: Duration = .seconds(10)
    /// The longest round trip a reading may take: its error is at most half of it.
    static let longestRoundTrip: Duration = .milliseconds(250)

    private let state = Mutex(State())
    private let client: PostgresClient

    init(client: PostgresClient) {
        self.client = client
    }

    /// The server's time now, as last measured; this machine's until a first reading.
    func now() -> Date {
        let (offset, stale) = state.withLock { state -> (Double, Bool) in
            let stale = !state.measuring && (state.nextReading.map { ContinuousClock.now >= $0 } ?? true)
            if stale { state.measuring = true }
            return (state.offset, stale)
        }
        if stale {
            // In the background: a caller computing a deadline does not wait for the server.
            Task { [self] in try? await measure() }
        }
        return Date().addingTimeInterval(offset)
    }

    /// The server's clock minus this machine's, in seconds, as last measured.
    var offset: Double { state.withLock { $0.offset } }

    /// The first reading, as the store opens: tried again while round trips are too long (the
    /// pool's first connections), up to five times; then this machine's clock until a later one.
    func start() async throws {
        for _ in 0..<5 {
            state.withLock { $0.measuring = true }
            try await measure()
            if state.withLock({ $0.measuredAt != nil }) { return }
        }
    }

    /// Asks the server for its time and keeps the offset, unless the round trip was too long.
    private func measure() async throws {
        let started = ContinuousClock.now
        defer {
            state.withLock {
                $0.measuring = false
                if $0.measuredAt.map({ $0 < started }) ?? true { $0.nextReading = started.advanced(by: .seconds(1)) }
            }
        }
        let before = Date()
        let rows = try await client.query(
            PostgresValue.query("SELECT \(PostgresStore.serverNow)", []), logger: PostgresStore.quiet
        ).collect()
        let roundTrip = ContinuousClock.now - started
        let after = Date()
        guard let row = rows.first, roundTrip <= Self.longestRoundTrip else { return }
        let server = Double(try Row(row).int64(0)) / 1000
        let middle = before.timeIntervalSince1970 + after.timeIntervalSince(before) / 2
        state.withLock {
            $0.offset = server - middle
            $0.measuredAt = ContinuousClock.now
            $0.nextReading = ContinuousClock.now.advanced(by: Self.refreshAfter)
        }
    }
}
