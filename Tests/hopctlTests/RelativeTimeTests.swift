import Foundation
import Testing

@testable import HopctlCommands

/// The times hopctl shows relative to now ("5m ago", "in 1h30m") are never shorter than they are
/// by more than a unit of their second place: an expiry of 90 minutes reads "in 1h30m", not "in 1h".
@Suite struct RelativeTimeTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test(arguments: [
        (0, "0s"), (59, "59s"), (60, "1m"), (65, "1m5s"), (3599, "59m59s"), (3600, "1h"), (5400, "1h30m"),
        (86_399, "23h59m"), (86_400, "1d"), (129_600, "1d12h"), (30 * 86_400, "30d"),
        (400 * 86_400 + 3 * 3600 + 59, "400d3h"),
    ])
    func aTimeReadsInItsTwoLargestUnits(seconds: Int, text: String) {
        #expect(Output.relative(Self.now.addingTimeInterval(-Double(seconds)), now: Self.now) == "\(text) ago")
        if seconds > 0 {
            #expect(Output.relative(Self.now.addingTimeInterval(Double(seconds)), now: Self.now) == "in \(text)")
        }
    }

    @Test func aTimeBeyondAnyClockStillReads() {
        #expect(Output.relative(.distantPast, now: Self.now).hasSuffix(" ago"))
        #expect(Output.relative(.distantFuture, now: Self.now).hasPrefix("in "))
        #expect(Output.relative(Date(timeIntervalSince1970: .greatestFiniteMagnitude), now: Self.now).hasPrefix("in "))
    }
}
