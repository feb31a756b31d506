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
        guard let boot else { return (Clock.milliseconds(until), nil) }
        return (Self.uptimeMilliseconds() + Clock.milliseconds(until) - Clock.nowMilliseconds(), boot)
    }

    /// `date` (by the wall clock) in milliseconds since boot; `nil` where the boot is unknown.
    package func uptime(at date: Date) -> Int64? {
        guard boot != nil else { return nil }
        return Self.uptimeMilliseconds() + Clock.milliseconds(date) - Clock.nowMilliseconds()
    }

    /// When a stored lease ends by the wall clock, for display and for ``RunRecord/leaseIsLive(at:)``:
    /// a lease of another boot ended when that boot did (shown as the epoch).
    package func wallClockEnd(expiresAt: Int64, boot leaseBoot: Int64?) -> Date {
        guard let leaseBoot else { return Clock.date(expiresAt) }
        guard leaseBoot == boot else { return Clock.date(0) }
        return Clock.date(Clock.nowMilliseconds() + expiresAt - Self.uptimeMilliseconds())
    }

    /// A parked step's deadline by the wall clock, for display: measured by the uptime clock in
    /// this boot (`uptime`), else the wall-clock time stored with it (`wall`).
    package func wallClockDeadline(wall: Int64, uptime: Int64?, boot deadlineBoot: Int64?) -> Date {
        guard let uptime, let deadlineBoot, deadlineBoot == boot else { return Clock.date(wall) }
        return Clock.date(Clock.nowMilliseconds() + uptime - Self.uptimeMilliseconds())
    }

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
