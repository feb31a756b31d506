import InMemoryLogging
import Logging

extension InMemoryLogHandler {
    /// A handler that keeps every level, for tests that read what was logged.
    public static func keepingEverything() -> InMemoryLogHandler {
        var handler = InMemoryLogHandler()
        handler.logLevel = .trace
        return handler
    }

    /// A logger whose messages this handler keeps (they share the handler's entries).
    public func logger(label: String) -> Logger {
        Logger(label: label, factory: { _ in self })
    }

    /// Each kept message at `level` or above, as "message [metadata]".
    public func texts(atLeast level: Logger.Level = .trace) -> [String] {
        entries.filter { $0.level >= level }.map { "\($0.message) \($0.metadata)" }
    }
}
