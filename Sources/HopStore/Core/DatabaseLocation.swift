#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// Where a Hop database lives when no path is given.
public enum DatabaseLocation {
    /// `$HOP_DB` if set, else `$XDG_STATE_HOME/hop/hop.sqlite`, else `~/.local/state/hop/hop.sqlite`.
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["HOP_DB"], !path.isEmpty { return path }
        if let state = environment["XDG_STATE_HOME"], !state.isEmpty {
            return joined(state, "hop/hop.sqlite")
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? accountHome() ?? "/"
        return joined(home, ".local/state/hop/hop.sqlite")
    }

    /// `folder` and `path` joined by one slash.
    static func joined(_ folder: String, _ path: String) -> String {
        folder.hasSuffix("/") ? folder + path : folder + "/" + path
    }

    /// The folder that `path` is in: "" for a bare file name, "/" for a file at the root.
    static func folder(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "" }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// The home folder of the user running this process, from the password database.
    private static func accountHome() -> String? {
        guard let entry = getpwuid(getuid()), let directory = entry.pointee.pw_dir else { return nil }
        return String(cString: directory)
    }
}
