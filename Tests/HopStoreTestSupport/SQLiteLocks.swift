import CSQLite
import Glibc

/// Freezes `process` (SIGSTOP) at a moment it holds no write lock on the SQLite database at
/// `path`. SQLite has one write lock for the whole file: an owner frozen in the middle of a commit
/// (a lease renewal, or coalesced records waiting the few milliseconds for theirs) holds it until
/// it is thawed or killed, and no other engine can write anything meanwhile (the README says so).
/// That is another scenario than a lease running out, so this thaws and freezes again until the
/// freeze falls between two commits.
public func freeze(_ process: ChildProcess, betweenCommitsOn path: String) async throws {
    try await waitUntil("the process is frozen between two of its commits", timeout: .seconds(30)) {
        process.kill(SIGSTOP)
        if writeLockIsFree(path) { return true }
        process.kill(SIGCONT)
        return false
    }
}

/// Whether a writer could begin a transaction on the SQLite database at `path` right now,
/// without waiting.
public func writeLockIsFree(_ path: String) -> Bool {
    var db: OpaquePointer?
    defer { sqlite3_close(db) }
    guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK,
        sqlite3_exec(db, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK
    else { return false }
    return sqlite3_exec(db, "ROLLBACK", nil, nil, nil) == SQLITE_OK
}
