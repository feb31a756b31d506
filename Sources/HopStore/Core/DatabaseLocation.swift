import Foundation

/// Where a Hop database lives when no path is given.
public enum DatabaseLocation {
    /// `$HOP_DB` if set, else `$XDG_STATE_HOME/hop/hop.sqlite`, else `~/.local/state/hop/hop.sqlite`.
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["HOP_DB"], !path.isEmpty { return path }
        if let state = environment["XDG_STATE_HOME"], !state.isEmpty {
            return (state as NSString).appendingPathComponent("hop/hop.sqlite")
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return (home as NSString).appendingPathComponent(".local/state/hop/hop.sqlite")
    }
}
