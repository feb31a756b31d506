import Foundation

/// A failure a test helper reports.
public struct TestFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Waits until `condition` holds, checking every few milliseconds, and fails after `timeout`.
public func waitUntil(
    _ what: String, timeout: Duration = .seconds(30), _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now.advanced(by: timeout)
    while true {
        if try await condition() { return }
        if ContinuousClock.now >= deadline {
            throw TestFailure("timed out after \(timeout) waiting until \(what)")
        }
        try await Task.sleep(for: .milliseconds(5))
    }
}

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
