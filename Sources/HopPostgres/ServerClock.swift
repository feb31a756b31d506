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
/// Measured when the store opens, then again in the background when the reading is older than
/// ``refreshAfter`` (the machine's clock may be stepped meanwhile). A reading's error is at most
/// half its round trip: one slower than ``longestRoundTrip`` (a busy pool or server) replaces the
/// last only when it is no slower than that one or the last is older than ``staleAfter``, and
/// another is taken a second later; the first reading is always kept (any is closer to the
/// server's time than this machine's clock may be).
final class ServerClock: Sendable {
    private struct Reading {
        /// The server's clock minus this machine's, in seconds.
        var offset: Double
        var roundTrip: Duration
        /// When it was taken (monotonic).
        var at: ContinuousClock.Instant
    }

    private struct State {
        var reading: Reading?
        /// When the next ``now()`` measures again; `nil`: at once.
        var nextReading: ContinuousClock.Instant?
        /// Whether a measurement is in flight.
        var measuring = false
    }

    /// How old a reading may be before the next ``now()`` measures again.
    static let refreshAfter: Duration = .seconds(10)
    /// A reading at least this old is replaced by any new one.
    static let staleAfter: Duration = .seconds(60)
    /// The longest round trip of a reading that is always taken: its error is at most half of it.
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
            return (state.reading?.offset ?? 0, stale)
        }
        if stale {
            // In the background: a caller computing a deadline does not wait for the server.
            Task { [self] in try? await measure() }
        }
        return Date().addingTimeInterval(offset)
    }

    /// The server's clock minus this machine's, in seconds, as last measured.
    var offset: Double { state.withLock { $0.reading?.offset ?? 0 } }

    /// The first reading, as the store opens.
    func start() async throws {
        state.withLock { $0.measuring = true }
        try await measure()
    }

    /// Asks the server for its time and keeps the reading, as the type's summary says.
    private func measure() async throws {
        let started = ContinuousClock.now
        defer {
            state.withLock {
                $0.measuring = false
                // A failed reading is tried again a second later.
                if $0.reading.map({ $0.at < started }) ?? true { $0.nextReading = started.advanced(by: .seconds(1)) }
            }
        }
        let before = Date()
        let rows = try await client.rows(of: PostgresValue.query("SELECT \(PostgresStore.serverNow)", []))
        let after = Date()
        let now = ContinuousClock.now
        let roundTrip = now - started
        guard let row = rows.first else { return }
        let server = Double(try Row(row).int64(0)) / 1000
        let middle = before.timeIntervalSince1970 + after.timeIntervalSince(before) / 2
        let reading = Reading(offset: server - middle, roundTrip: roundTrip, at: now)
        let fast = roundTrip <= Self.longestRoundTrip
        state.withLock {
            let better =
                $0.reading.map { fast || roundTrip <= $0.roundTrip || now - $0.at >= Self.staleAfter } ?? true
            if better { $0.reading = reading }
            $0.nextReading = now.advanced(by: fast ? Self.refreshAfter : .seconds(1))
        }
    }
}
