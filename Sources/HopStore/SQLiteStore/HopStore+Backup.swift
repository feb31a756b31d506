#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// Online backup: a consistent copy of the database, written while daemons go on writing.
extension HopStore {
    /// What ``backup(to:)`` wrote.
    public struct Backup: Sendable, Equatable {
        /// The copy's path.
        public let path: String
        /// Its size in bytes.
        public let bytes: Int64
        /// How many runs it holds.
        public let runs: Int
        /// Its schema version (the same as this database's).
        public let schemaVersion: Int
    }

    /// Writes a consistent copy of the database to `target`, a new file (mode 0600), while
    /// other processes go on writing, and checks it (`PRAGMA integrity_check`) before it returns.
    ///
    /// The copy is one read snapshot of the database ([`VACUUM INTO`](https://sqlite.org/lang_vacuum.html#vacuuminto)):
    /// every run in it is as it was at one moment, and a daemon started on it resumes each run
    /// from there. Writers are never blocked; this store's own writes wait while it copies.
    /// Coalesced writes applied so far are committed first, so the copy holds them.
    ///
    /// - Throws: `.cannotOpen`, changing nothing, when `target` exists or cannot be created;
    ///   `.notADatabase` or an SQLite error when the copy cannot be written or does not check out
    ///   (the partial copy is removed).
    public func backup(to target: String) throws -> Backup {
        let operation = "back up to \(target)"
        try makeDurable()
        try Self.createBackupFile(target, operation: operation)
        do {
            try connection.run("VACUUM INTO ?1", [.text(target)], operation: operation)
            try Self.flushToDisk(target, operation: operation)
            try connection.run("ATTACH DATABASE ?1 AS backup", [.text(target)], operation: operation)
            defer { _ = try? connection.run("DETACH DATABASE backup", [], operation: operation) }
            let check = try connection.query("PRAGMA backup.integrity_check", [], operation: operation) { $0.text(0) }
            guard check == ["ok"] else {
                throw HopError(
                    .notADatabase, operation: operation, path: target,
                    reason: "the copy does not check out: \(check.prefix(3).joined(separator: "; "))",
                    hint: "Check the disk the copy went to and run the backup again")
            }
            let runs = try connection.queryOne("SELECT count(*) FROM backup.runs", [], operation: operation) {
                Int($0.int64(0))
            }
            var info = stat()
            let bytes = stat(target, &info) == 0 ? Int64(info.st_size) : 0
            return Backup(path: target, bytes: bytes, runs: runs ?? 0, schemaVersion: schemaVersion)
        } catch {
            unlink(target)
            for suffix in DatabaseFile.companions { unlink(target + suffix) }
            throw error
        }
    }

    /// Creates `target` empty and private (mode 0600), refusing one that exists: `VACUUM INTO`
    /// writes into an empty file and keeps its mode.
    private static func createBackupFile(_ target: String, operation: String) throws {
        if !DatabaseFile.isFilePath(target) {
            throw HopError(
                .cannotOpen, operation: operation, path: target, reason: "'\(target)' is not a file path",
                hint: "Give the path of a new file, e.g. /var/backups/hop-$(date +%F).sqlite")
        }
        let descriptor = Glibc.open(target, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else {
            let code = errno
            var info = stat()
            if code == EEXIST, stat(target, &info) == 0, info.st_mode & S_IFMT == S_IFDIR {
                throw HopError(
                    .cannotOpen, operation: operation, path: target, reason: "the path is a folder",
                    hint: "Name a new file in it, e.g. \(target)/hop-$(date +%F).sqlite")
            }
            throw HopError(
                .cannotOpen, operation: operation, path: target,
                reason: code == EEXIST
                    ? "the file exists; a backup never overwrites a file"
                    : "the file cannot be created (\(String(cString: strerror(code))))",
                hint: code == EEXIST
                    ? "Choose a new path, or remove the old file first"
                    : "Check that the folder exists and is writable, and that the disk is not full")
        }
        fchmod(descriptor, 0o600)
        close(descriptor)
    }

    /// Forces the copy, and its entry in its folder, to disk: it is a backup only once it
    /// survives a power loss.
    private static func flushToDisk(_ target: String, operation: String) throws {
        try flush(target, flags: O_RDONLY | O_CLOEXEC | O_NOFOLLOW, what: "the copy", operation: operation)
        let slash = target.lastIndex(of: "/")
        let folder = slash.map { $0 == target.startIndex ? "/" : String(target[..<$0]) } ?? "."
        try flush(folder, flags: O_RDONLY | O_CLOEXEC | O_DIRECTORY, what: "the copy's folder", operation: operation)
    }

    private static func flush(_ target: String, flags: Int32, what: String, operation: String) throws {
        let descriptor = Glibc.open(target, flags)
        guard descriptor >= 0 else {
            throw HopError(
                .ioFailure, operation: operation, path: target,
                reason: "\(what) cannot be opened to flush it (\(String(cString: strerror(errno))))")
        }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else {
            throw HopError(
                .ioFailure, operation: operation, path: target,
                reason: "\(what) cannot be flushed to disk (\(String(cString: strerror(errno))))",
                hint: "Check the disk the copy went to and run the backup again")
        }
    }
}
