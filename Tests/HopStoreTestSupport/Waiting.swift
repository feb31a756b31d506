import Foundation

/// A failure a test helper reports.
public struct TestFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Waits until `condition` holds and fails after `timeout`.
///
/// The deadline only keeps a failing test from hanging: a test that asserts how soon something
/// happens measures it, never with this deadline. None sets one under 30 s: at the suite's
/// busiest (its first minutes, both cores taken), a daemon's start or an engine's durable hop
/// has been seen to take 15 s. The default is a minute: a failing test waits longer, a passing
/// one no longer.
///
/// It looks again after a millisecond, then twice as long each time, up to every 40 ms: a
/// condition that holds at once is seen at once, and a long wait costs few wake-ups. The suite
/// runs a few hundred waits at once: looking every 5 ms, they woke the test process thousands
/// of times a second, on 2-core virtual machines whose idle cores halt (each wake-up an exit to
/// the host).
///
/// A condition that held only after half the deadline is said on standard error ("slow wait",
/// with where the wait is): a full run's log shows the deadlines a loaded machine comes near,
/// before one is missed.
public func waitUntil(
    _ what: String, timeout: Duration = .seconds(60), file: StaticString = #fileID, line: UInt = #line,
    _ condition: () async throws -> Bool
) async throws {
    let started = ContinuousClock.now
    let deadline = started.advanced(by: timeout)
    var pause = Duration.milliseconds(1)
    while true {
        if try await condition() {
            let waited = ContinuousClock.now - started
            if waited * 2 > timeout {
                FileHandle.standardError.write(
                    Data("slow wait at \(file):\(line): \(what): \(waited) of \(timeout)\n".utf8))
            }
            return
        }
        if ContinuousClock.now >= deadline {
            throw TestFailure("timed out after \(timeout) waiting until \(what)")
        }
        try await Task.sleep(for: pause)
        pause = min(pause * 2, longestPauseBetweenLooks)
    }
}

/// The longest `waitUntil` waits between two looks at its condition.
private let longestPauseBetweenLooks = Duration.milliseconds(40)

/// A folder that lives as long as the value, for one test's files.
public final class TemporaryDirectory: Sendable {
    public let url: URL

    public init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("hop-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    /// The path of `name` inside the folder.
    public func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// A database path inside the folder.
    public var database: String { path("hop.sqlite") }
}
