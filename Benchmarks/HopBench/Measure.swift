import Foundation

/// One measured figure: printed as `name value unit`.
struct Figure: Sendable {
    var name: String
    var value: Double
    var unit: String

    var line: String { "\(name) \(Self.format(value)) \(unit)" }

    static func format(_ value: Double) -> String {
        if value >= 100 || value == value.rounded() { return String(Int64(value.rounded())) }
        if value >= 1 { return String(format: "%.2f", value) }
        return String(format: "%.3f", value)
    }

    init(_ name: String, _ value: Double, _ unit: String) {
        self.name = name
        self.value = value
        self.unit = unit
    }

    init?(line: String) {
        let parts = line.split(separator: " ")
        guard parts.count == 3, let value = Double(parts[1]) else { return nil }
        self.init(String(parts[0]), value, String(parts[2]))
    }
}

enum Measure {
    /// Seconds taken by `body`.
    static func seconds(_ body: () async throws -> Void) async rethrows -> Double {
        let start = ContinuousClock.now
        try await body()
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    /// The process's resident memory now and its peak, in MiB (from /proc/self/status).
    static func memory() -> (resident: Double, peak: Double) {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return (0, 0) }
        func kibibytes(_ key: String) -> Double {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(key) }) else { return 0 }
            return Double(line.split(separator: " ").dropFirst().first.map(String.init) ?? "") ?? 0
        }
        return (kibibytes("VmRSS:") / 1024, kibibytes("VmHWM:") / 1024)
    }

    /// Resets the peak resident memory to the current one, so that a later peak belongs to
    /// what ran after this call (Linux `clear_refs`; a no-op where it is not allowed).
    static func resetPeakMemory() {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
    }

    /// Asks glibc's malloc to return its free memory to the system (`malloc_trim(0)`), so that
    /// the resident size that follows counts what is in use rather than what was freed.
    static func releaseFreeMemory() {
        guard let symbol = dlsym(nil, "malloc_trim") else { return }
        _ = unsafeBitCast(symbol, to: (@convention(c) (Int) -> Int32).self)(0)
    }

    /// Waits until `condition` holds, checking every millisecond.
    static func waitUntil(
        _ what: String, timeout: Duration = .seconds(600), _ condition: () async throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw BenchError("timed out waiting until \(what)") }
            try await Task.sleep(for: .milliseconds(1))
        }
    }
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
