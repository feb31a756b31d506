internal import CSQLite

#if canImport(Glibc)
import Glibc
#endif

/// How a connection waits for another process's lock: it tries again every millisecond at most
/// until its busy timeout is spent.
///
/// SQLite's own handler (`sqlite3_busy_timeout`) sleeps longer and longer between tries, 100 ms
/// apart after the first third of a second. Beside a process that writes in back-to-back
/// transactions (`hopctl prune`), a try every 100 ms seldom falls between two of them: a daemon's
/// write waited up to 2.8 s beside a prune of 1,000,000 runs. Trying every millisecond, it gets
/// the lock in the first pause the other process leaves (`HopStore.handOver`).
final class BusyWait {
    /// The busy timeout, in nanoseconds.
    private let limit: UInt64
    /// When the wait in progress began (`CLOCK_MONOTONIC`, nanoseconds).
    private var began: UInt64 = 0
    /// Called as a wait begins and every ``reportEvery`` while it lasts (`HopStore` says so in
    /// the heartbeats of its incarnations: see ``LivenessLocks``).
    var whileWaiting: (() -> Void)?
    /// When `whileWaiting` was last called in the wait in progress.
    private var reported: UInt64 = 0
    /// How often a long wait calls `whileWaiting`, in nanoseconds.
    static let reportEvery: UInt64 = 250_000_000

    init(timeout: Duration) {
        let (seconds, attoseconds) = timeout.components
        limit =
            UInt64(clamping: max(0, seconds)) &* 1_000_000_000 &+ UInt64(clamping: max(0, attoseconds) / 1_000_000_000)
    }

    /// Installs the handler on `handle`; the connection keeps `self` alive as long as the handle.
    func install(on handle: OpaquePointer) {
        sqlite3_busy_handler(
            handle,
            { context, count in
                guard let context else { return 0 }
                return Unmanaged<BusyWait>.fromOpaque(context).takeUnretainedValue().again(after: count) ? 1 : 0
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Whether to try again after `count` failed tries of this wait, having slept a little.
    private func again(after count: Int32) -> Bool {
        let now = Self.now()
        if count == 0 { began = now }
        if let whileWaiting, count == 0 || now &- reported >= Self.reportEvery {
            reported = now
            whileWaiting()
        }
        let waited = now &- began
        guard waited < limit else { return false }
        // A few short sleeps first (a write lock is often held for less than a millisecond),
        // then a millisecond at a time; never past the timeout.
        let pause: UInt64 = count < 4 ? 100_000 << UInt64(count) : 1_000_000
        let nanoseconds = min(pause, limit - waited)
        usleep(useconds_t(max(1, nanoseconds / 1000)))
        return true
    }

    private static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }
}
