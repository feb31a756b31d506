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
        try await stopEveryThread(of: process.processIdentifier)
        if writeLockIsFree(path) { return true }
        process.kill(SIGCONT)
        return false
    }
}

/// Sends SIGSTOP to process `pid` and returns once every thread of it has stopped. `kill`
/// returns before that: a lock looked at right after it may still be taken by a thread that
/// runs on for a moment (once, under load, a commit did so, and the frozen process held the
/// write lock of the database the test had just seen free).
public func stopEveryThread(of pid: pid_t) async throws {
    Glibc.kill(pid, SIGSTOP)
    try await waitUntil("process \(pid) has stopped", timeout: .seconds(30)) {
        let tasks = "/proc/\(pid)/task"
        guard let folder = opendir(tasks) else { return true }  // gone: nothing runs on
        defer { closedir(folder) }
        while let entry = readdir(folder) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard name.first?.isNumber == true, let state = threadState("\(tasks)/\(name)/stat") else { continue }
            if state != "T" && state != "t" && state != "Z" && state != "X" { return false }
        }
        return true
    }
}

/// The state letter of a thread's `/proc/…/stat` line (after its name, which may hold spaces and
/// parentheses); `nil` when the thread is gone.
private func threadState(_ path: String) -> Character? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 1024)
    guard fgets(&buffer, Int32(buffer.count), file) != nil else { return nil }
    let line = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    guard let close = line.lastIndex(of: ")") else { return nil }
    return line[line.index(after: close)...].first { $0 != " " }
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

/// Runs `body` while this process holds the write lock of the SQLite database at `path` (an open
/// `BEGIN IMMEDIATE` transaction, rolled back after `body`), as an operator's `sqlite3` session
/// or a `VACUUM` does: every other writer of the file waits meanwhile. Takes the lock at the
/// first moment no other process holds it.
public func holdingTheWriteLock<T>(of path: String, _ body: () async throws -> T) async throws -> T {
    var db: OpaquePointer?
    defer { sqlite3_close(db) }
    guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK else {
        throw TestFailure("cannot open \(path)")
    }
    try await waitUntil("the write lock of \(path) is taken", timeout: .seconds(30)) {
        sqlite3_exec(db, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK
    }
    defer { sqlite3_exec(db, "ROLLBACK", nil, nil, nil) }
    return try await body()
}
