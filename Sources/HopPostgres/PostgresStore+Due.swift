import Foundation
import HopStore

/// What an engine's watch asks at every poll (50 ms by default): whether a parked run's deadline
/// has come (``PostgresStore/dueTimeouts(now:)``) and whether a session has expired
/// (``PostgresStore/expireSessions(now:)``). Almost always nothing is due. Asked of the server,
/// that was two statements per poll per engine: an idle fleet of 20 engines made the server
/// commit 880 transactions a second, for nothing.
///
/// The store reads the next deadline and the next expiry in one statement instead, and answers
/// from that look until one of these comes:
/// - that time itself;
/// - a transaction of this store that parked a run with a deadline or stored a session with an
///   expiry ended (``dueWritten()``);
/// - another store notified a change (``ChangeListener``: a login that woke a run, a release, …),
///   or the listening connection was opened again;
/// - ``PostgresStore/dueLookEvery`` (1 s) has passed since the look: a deadline or an expiry
///   another process wrote without notifying (a run parked with a timeout by another engine, a
///   session stored by `hopctl` that woke no run) is seen within it. Its own writes, each
///   process sees at once.
///
/// Once something came due, the look is forgotten (``forgetDueLook()``): acting on it (a timeout
/// recorded, a session removed) changes what comes next.
struct DueLook: Sendable {
    /// The earliest deadline of a parked run, in milliseconds by the server's clock; `nil`: none.
    var wakeAt: Int64?
    /// The earliest expiry of a stored session, likewise.
    var expiresAt: Int64?
    /// What the look was made after: the store's writes of deadlines and expiries, the notified
    /// changes, and when.
    var dueWrites: Int64
    var changes: Int64
    var at: ContinuousClock.Instant
}

extension PostgresStore {
    /// The earliest deadline of a parked run and the earliest session expiry: both searches
    /// read the first entry of their partial index.
    package static let nextDueSQL = """
        SELECT (SELECT min(wake_at) FROM runs WHERE wake_at IS NOT NULL AND status = 'parked'),
               (SELECT min(expires_at) FROM sessions WHERE expires_at IS NOT NULL)
        """

    /// The last look at what comes due next, or a new one when it may be out of date (``DueLook``).
    func nextDue() async throws -> DueLook {
        // Taken before the read: a write that ends while it runs makes the look out of date.
        let dueWrites = dueWritesEnded.load(ordering: .sequentiallyConsistent)
        let changes = self.changes.current
        let now = ContinuousClock.now
        if let look = dueLook.withLock({ $0 }), look.dueWrites == dueWrites, look.changes == changes,
            now - look.at < dueLookEvery
        {
            return look
        }
        dueLooks.add(1, ordering: .relaxed)
        let row = try await read(Self.nextDueSQL, operation: "look for what comes due") {
            (try $0.optionalInt64(0), try $0.optionalInt64(1))
        }.first
        let look = DueLook(
            wakeAt: row?.0, expiresAt: row?.1, dueWrites: dueWrites, changes: changes, at: now)
        dueLook.withLock { $0 = look }
        return look
    }

    /// Says that a transaction that may have written a deadline or an expiry has ended, whatever
    /// became of it: the last look may have missed it. Called once the transaction is over, never
    /// before its commit (a look made in between would be taken as up to date).
    func dueWritten() {
        dueWritesEnded.add(1, ordering: .sequentiallyConsistent)
    }

    /// Forgets the last look: what came due is being acted on (a timeout recorded, a session
    /// removed), so the next poll looks again rather than finding it due again.
    func forgetDueLook() {
        dueLook.withLock { $0 = nil }
    }
}
