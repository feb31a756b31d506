#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

#if canImport(Glibc)
import Glibc
#endif

/// The checks Hop makes on a database path before SQLite opens it, and the file's creation.
///
/// Hop adopts only a regular file, reached without a symbolic link, and keeps it and its `-wal`
/// and `-shm` files private (mode 0600), since they hold session tokens in plain text.
enum DatabaseFile {
    /// The companion files SQLite keeps beside a database in WAL mode (and a rollback journal).
    static let companions = ["-wal", "-shm", "-journal"]

    /// Checks `path` and, with `create`, creates the file (mode 0600, its folder 0700) when missing.
    /// - Returns: whether this call created the file.
    static func adopt(_ path: String, create: Bool) throws -> Bool {
        if !isFilePath(path) {
            throw refusal(
                path,
                "'\(path)' is not a database file path: Hop keeps its state in a file (no in-memory database, no URI)",
                hint: "Give a file path with --db or $HOP_DB, e.g. /var/lib/my-daemon/hop.sqlite")
        }
        var info = stat()
        if lstat(path, &info) != 0 {
            let error = errno
            guard error == ENOENT else { throw openFailure(path, errno: error) }
            guard create else {
                throw HopError(
                    .missing, operation: "open", path: path, reason: "no database exists at this path",
                    hint: "Check --db or $HOP_DB, or create it with `hopctl migrate`")
            }
            return try createFile(path)
        }
        try check(path, info)
        try keepPrivate(path, info)
        return false
    }

    /// Whether `path` names a file, not SQLite's in-memory database or a URI.
    static func isFilePath(_ path: String) -> Bool {
        !(path.isEmpty || path == ":memory:" || path.hasPrefix("file:"))
    }

    /// After `error` opening or setting up a database this process created: removes the file if
    /// it is still empty (nothing was stored), with its companions, so that nothing is left
    /// behind; returns the error to throw, saying so when it did.
    static func discardCreated(_ path: String, after error: any Error) -> any Error {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_size == 0 else { return error }
        unlink(path)
        for suffix in companions { unlink(path + suffix) }
        guard var error = error as? HopError else { return error }
        error.hint = [error.hint, "The empty file it had created was removed"].compactMap { $0 }.joined(separator: ". ")
        return error
    }

    private static func check(_ path: String, _ info: stat) throws {
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            break
        case S_IFLNK:
            let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? "?"
            throw refusal(
                path, "the path is a symbolic link (to \(target)); Hop opens only the database file itself",
                hint: "Pass the real path, e.g. --db \(URL(fileURLWithPath: path).resolvingSymlinksInPath().path)")
        case S_IFDIR:
            throw refusal(
                path, "the path is a folder, not a database file", hint: "Name a file, e.g. \(path)/hop.sqlite")
        default:
            throw refusal(
                path, "the path is not a regular file (a device, a pipe or a socket); nothing was changed",
                hint: "Give the path of a Hop database file with --db or $HOP_DB")
        }
        guard access(path, R_OK | W_OK) == 0 else { throw openFailure(path, errno: errno, info: info) }
    }

    /// Tightens the file and its companions to 0600 when Hop adopts them; refuses a file it
    /// cannot make private (another user's).
    private static func keepPrivate(_ path: String, _ info: stat) throws {
        for (file, mode, owner) in [(path, info.st_mode, info.st_uid)]
            + companions.compactMap({ suffix -> (String, mode_t, uid_t)? in
                var companion = stat()
                guard lstat(path + suffix, &companion) == 0, companion.st_mode & S_IFMT == S_IFREG else { return nil }
                return (path + suffix, companion.st_mode, companion.st_uid)
            }) where mode & 0o077 != 0
        {
            guard owner == geteuid() || geteuid() == 0, chmod(file, 0o600) == 0 else {
                throw refusal(
                    path,
                    "\(file) is readable by other users (mode \(String(mode & 0o777, radix: 8))) and cannot be made private: it is owned by \(userName(owner))",
                    hint: "Run `chmod 600 \(file)` as its owner, or run as that user")
            }
        }
    }

    private static func createFile(_ path: String) throws -> Bool {
        let folder = DatabaseLocation.folder(of: path)
        if !folder.isEmpty {
            do {
                try FileManager.default.createDirectory(
                    atPath: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw HopError(
                    .cannotOpen, operation: "create database", path: path,
                    reason: "its folder \(folder) cannot be created (\(error))",
                    hint: "Create the folder, or choose a writable path with --db or $HOP_DB")
            }
        }
        let descriptor = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            let error = errno
            if error == EEXIST {
                // Another process created it meanwhile: adopt it as it is.
                var info = stat()
                guard lstat(path, &info) == 0 else { throw openFailure(path, errno: errno) }
                try check(path, info)
                return false
            }
            if error == EACCES { throw openFailure(path, errno: error) }
            throw HopError(
                .cannotOpen, operation: "create database", path: path,
                reason: "the file cannot be created (\(String(cString: strerror(error))))",
                hint:
                    "Check that the folder is writable and the disk not full, or choose another path with --db or $HOP_DB"
            )
        }
        fchmod(descriptor, 0o600)
        close(descriptor)
        return true
    }

    private static func openFailure(_ path: String, errno code: Int32, info: stat? = nil) -> HopError {
        guard code == EACCES || code == EPERM else {
            return HopError(
                .cannotOpen, operation: "open", path: path,
                reason: "the database cannot be opened (\(String(cString: strerror(code))))",
                hint: "Check the path and its folder")
        }
        var known = stat()
        let details = info ?? (lstat(path, &known) == 0 ? known : nil)
        guard let details else {
            return HopError(
                .cannotOpen, operation: "open", path: path,
                reason: "permission denied: this user cannot reach the database's folder",
                hint: "Run as the user that owns the daemon's state, e.g. `sudo -u USER hopctl …`")
        }
        let owner = userName(details.st_uid)
        return HopError(
            .cannotOpen, operation: "open", path: path,
            reason:
                "permission denied: the database belongs to \(owner) (mode \(String(details.st_mode & 0o777, radix: 8))) and this user may not read and write it",
            hint: "Run as its owner, e.g. `sudo -u \(owner) hopctl …`")
    }

    private static func refusal(_ path: String, _ reason: String, hint: String) -> HopError {
        HopError(.cannotOpen, operation: "open", path: path, reason: reason, hint: hint)
    }

    private static func userName(_ uid: uid_t) -> String {
        guard let entry = getpwuid(uid), let name = entry.pointee.pw_name else { return "uid \(uid)" }
        return String(cString: name)
    }
}
