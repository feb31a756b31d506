#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Times as Hop stores them: milliseconds since the Unix epoch.
package enum Clock {
    /// The latest time Hop stores: year 9999 (later dates, e.g. a session that never expires in
    /// practice, are stored as this).
    package static let latestMilliseconds: Int64 = 253_402_300_799_000

    package static func nowMilliseconds() -> Int64 { milliseconds(Date()) }

    package static func date(_ milliseconds: Int64) -> Date { Date(timeIntervalSince1970: Double(milliseconds) / 1000) }

    /// `date` in milliseconds, clamped to years 0…9999: no date a caller or a file hands in traps.
    package static func milliseconds(_ date: Date) -> Int64 {
        let value = (date.timeIntervalSince1970 * 1000).rounded()
        guard value.isFinite else { return value < 0 ? -latestMilliseconds : latestMilliseconds }
        return Int64(max(-Double(latestMilliseconds), min(Double(latestMilliseconds), value)))
    }
}
