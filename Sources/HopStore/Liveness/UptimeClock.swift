import Synchronization

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// The clock a database file's leases and parked steps' deadlines are measured by: the machine's
/// uptime (`CLOCK_BOOTTIME`, suspend included), which every process on the machine shares and
/// which is never stepped, and the identity of the boot it counts from.
///
/// Every engine on a SQLite file runs on the same machine, so it shares this clock. The wall
/// clock would not do: a step forward (NTP setting the clock of a device that booted with a stale
/// one, an operator's `date -s`) expired every lease at once, and a second engine took over the
/// runs a live engine was executing; a step back kept a frozen engine's runs that much longer.
/// Parked steps timed out early or late by the step. A lease of an earlier boot is over: its
/// engine died with that boot; a deadline of an earlier boot goes by the wall clock.
package struct UptimeClock: Sendable {
    /// This boot's identity (the first 64 bits of Linux's boot id: an integer, so that a lease
    /// adds 8 bytes to its run's row); `nil` where the kernel does not say (leases then go by the
    /// wall clock).
    package let boot: Int64?

    /// The machine's boot, as Linux names it.
    package static let machine = UptimeClock(boot: Self.readBootID())

    package init(boot: Int64?) { self.boot = boot }

    /// A lease that ends at `until` by the wall clock, as stored: its end in milliseconds since
    /// boot and the boot, or in milliseconds by the wall clock without a boot.
    package func lease(until: Date) -> (expiresAt: Int64, boot: Int64?) {
        guard let uptime = uptime(at: until) else { return (Clock.milliseconds(until), nil) }
        return (uptime, boot)
    }

    /// `date` (by the wall clock) in milliseconds since boot; `nil` where the boot is unknown.
    package func uptime(at date: Date) -> Int64? {
        guard boot != nil else { return nil }
        return Clock.milliseconds(date) - Self.wallClockAtBoot()
    }

    /// When a stored lease ends by the wall clock, for display and for ``RunRecord/leaseIsLive(at:)``:
    /// a lease of another boot ended when that boot did (shown as the epoch).
    package func wallClockEnd(expiresAt: Int64, boot leaseBoot: Int64?) -> Date {
        guard leaseBoot != nil else { return Clock.date(expiresAt) }
        return wallClockTime(uptime: expiresAt, boot: leaseBoot) ?? Clock.date(0)
    }

    /// A parked step's deadline by the wall clock, for display: measured by the uptime clock in
    /// this boot (`uptime`), else the wall-clock time stored with it (`wall`).
    package func wallClockDeadline(wall: Int64, uptime: Int64?, boot deadlineBoot: Int64?) -> Date {
        uptime.flatMap { wallClockTime(uptime: $0, boot: deadlineBoot) } ?? Clock.date(wall)
    }

    /// `uptime` (milliseconds since boot `uptimeBoot`) by the wall clock; `nil` for a time of
    /// another boot, or of no boot.
    package func wallClockTime(uptime: Int64, boot uptimeBoot: Int64?) -> Date? {
        guard let boot, uptimeBoot == boot else { return nil }
        return Clock.date(uptime + Self.wallClockAtBoot())
    }

    /// The wall-clock time of the boot, in milliseconds (the wall clock minus the uptime clock):
    /// what converts a time by one clock into the other. Measured at every conversion, between
    /// two readings of the uptime clock no more than a millisecond apart (a thread preempted
    /// between its readings measures again), but the last value is kept while the new one is
    /// within 5 ms of it, so that a stored time converts to the same value from one read to the
    /// next: the two clocks' milliseconds do not turn over together, so their difference
    /// alternates between two values. NTP's slewing moves it about 0.5 ms a second at most, a
    /// step at once.
    static func wallClockAtBoot() -> Int64 {
        var measured: Int64 = 0
        for _ in 0..<5 {
            let before = uptimeMilliseconds()
            let wall = Clock.nowMilliseconds()
            let after = uptimeMilliseconds()
            measured = wall - before
            if after - before <= 1 { break }
        }
        return kept.withLock { kept in
            if let value = kept, abs(value - measured) <= 5 { return value }
            kept = measured
            return measured
        }
    }

    private static let kept = Mutex<Int64?>(nil)

    /// Milliseconds since the machine booted, suspend included.
    package static func uptimeMilliseconds() -> Int64 {
        var now = timespec()
        #if os(Linux)
        let clock = CLOCK_BOOTTIME
        #else
        let clock = CLOCK_MONOTONIC  // Darwin's counts sleep too; no boot id there: leases go by the wall clock
        #endif
        guard clock_gettime(clock, &now) == 0 else { return 0 }
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }

    private static func readBootID() -> Int64? {
        guard let text = try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8) else {
            return nil
        }
        let digits = text.filter(\.isHexDigit).prefix(16)
        guard digits.count == 16, let value = UInt64(digits, radix: 16) else { return nil }
        return Int64(bitPattern: value)
    }
}
