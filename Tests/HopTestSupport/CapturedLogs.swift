import Logging
import Synchronization

/// A log handler that keeps every message with its level and metadata, for tests that read logs.
public final class CapturedLogs: Sendable {
    /// Each message as its level and "message [metadata]".
    public let lines = Mutex<[(level: Logger.Level, text: String)]>([])

    public init() {}

    /// The factory to hand to `Logger(label:factory:)`.
    public func handler(label: String) -> LogHandler { Handler(logs: self) }

    /// The texts logged at `level` or above.
    public func texts(atLeast level: Logger.Level = .trace) -> [String] {
        lines.withLock { $0.filter { $0.level >= level }.map(\.text) }
    }

    struct Handler: LogHandler {
        let logs: CapturedLogs
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let all = metadata.merging(event.metadata ?? [:]) { $1 }
            logs.lines.withLock { $0.append((event.level, "\(event.message) \(all)")) }
        }
    }
}
