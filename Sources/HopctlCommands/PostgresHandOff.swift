#if canImport(Glibc)
import Glibc
#endif

/// `hopctl` itself links SQLite only, so that it starts in a few milliseconds (no Foundation, no
/// ICU, no SwiftNIO); a command line that names a PostgreSQL database (`--db postgres://…`,
/// `copy --to postgres://…`, `HOP_DB=postgres://…`) is handed to `hopctl-postgres`, the same
/// commands built with the PostgreSQL client, which hopctl finds beside its own executable.
package enum PostgresHandOff {
    /// The executable that runs hopctl's commands on a server's database.
    package static let helperName = "hopctl-postgres"

    /// Whether `arguments` or `$HOP_DB` name a server's database.
    package static func isNeeded(arguments: [String], hopDB: String?) -> Bool {
        if let hopDB, OpenDatabases.isServerURL(hopDB) { return true }
        return arguments.contains { argument in
            OpenDatabases.isServerURL(argument)
                || (argument.hasPrefix("--")
                    && argument.split(separator: "=", maxSplits: 1).last.map {
                        OpenDatabases.isServerURL(String($0))
                    } == true)
        }
    }

    /// Replaces this process with `hopctl-postgres` from this executable's folder, with the same
    /// arguments and environment. Returns only when that cannot be done: then it says why and exits 1.
    package static func handOff() -> Never {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        let executable =
            length > 0 ? String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
        let folder = executable.split(separator: "/", omittingEmptySubsequences: false).dropLast()
            .joined(separator: "/")
        let helper = folder + "/" + helperName
        execv(helper, CommandLine.unsafeArgv)
        let reason = String(cString: strerror(errno))
        let message =
            "Error: this database is on a PostgreSQL server, which hopctl reaches through \(helperName); "
            + "it cannot be run from \(folder.isEmpty ? "hopctl's folder" : folder) (\(reason)). "
            + "Install \(helperName) (built with hopctl: swift build --product \(helperName)) beside hopctl; nothing was changed\n"
        _ = message.withCString { write(STDERR_FILENO, $0, strlen($0)) }
        exit(1)
    }
}
