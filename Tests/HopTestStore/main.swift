import CSQLite
import Foundation
import HopStore
import Synchronization

// Test helper: opens a Hop database in its own process, as a daemon or hopctl would.
// Usage: hop-test-store migrate PATH    prints the schema version
//        hop-test-store modes PATH      writes once, then prints the permission bits of the file, its -wal and -shm
//        hop-test-store hold-lock PATH  takes the write lock, prints "locked", holds it until standard input closes
//        hop-test-store hold-read PATH  reads in a transaction, prints "reading", keeps that snapshot (and
//                                       the write-ahead log from being checkpointed past it) until standard
//                                       input closes
//        hop-test-store set-history-step PATH RUN SEQ STEP
//                                       renames the step of one history entry, as if an older flow
//                                       version had recorded it (to make a run diverge)
//        hop-test-store fill-finished PATH N DAYS [SUBJECTS]
//                                       adds N completed runs of the flow "archive" (subjects device-0 …
//                                       device-999, or as many as SUBJECTS says, in turn), five history
//                                       entries each, that finished DAYS days ago, in one transaction
//        hop-test-store write-loop PATH BUSY_MS
//                                       writes a fact in a transaction of its own every 2 ms, as a
//                                       daemon would, waiting BUSY_MS at most for the write lock,
//                                       until standard input closes; then prints
//                                       "writes N failed F longest MS passed R": R, the most runs
//                                       another process removed (by lowest id, as a prune does)
//                                       while one write waited
//        hop-test-store migrate-newer PATH
//                                       opens the database as a newer Hop would: one migration more
//                                       than this build has (a table "later"); prints the schema version
//        hop-test-store no-auto-vacuum PATH
//                                       rewrites the database without auto-vacuum, as Hop 0.1 created it
//        hop-test-store earlier-boot PATH
//                                       moves every lease and deadline kept by the uptime clock to
//                                       another boot, as if the machine had restarted since
//        hop-test-store peak-memory FILE COMMAND [ARGUMENTS…]
//                                       runs COMMAND with this process's standard input, output and
//                                       error, writes its peak resident memory in KiB to FILE, and
//                                       exits with its status. (A test process cannot measure this
//                                       itself: a process it spawns starts as its copy, and Linux
//                                       counts the test process's own peak as the child's.)
// HOP_TEST_UMASK=<octal> sets the process's umask first.

if let mask = ProcessInfo.processInfo.environment["HOP_TEST_UMASK"], let value = mode_t(mask, radix: 8) {
    umask(value)
}
let arguments = CommandLine.arguments
if arguments.count == 6, arguments[1] == "set-history-step", let run = Int64(arguments[3]),
    let seq = Int64(arguments[4])
{
    var db: OpaquePointer?
    var statement: OpaquePointer?
    let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
    guard sqlite3_open(arguments[2], &db) == SQLITE_OK,
        sqlite3_prepare_v2(db, "UPDATE history SET step = ?1 WHERE run_id = ?2 AND seq = ?3", -1, &statement, nil)
            == SQLITE_OK,
        sqlite3_bind_text(statement, 1, arguments[5], -1, transient) == SQLITE_OK,
        sqlite3_bind_int64(statement, 2, run) == SQLITE_OK, sqlite3_bind_int64(statement, 3, seq) == SQLITE_OK,
        sqlite3_step(statement) == SQLITE_DONE, sqlite3_changes(db) == 1
    else {
        FileHandle.standardError.write(Data("cannot rename the step of entry \(seq) of run \(run)\n".utf8))
        exit(1)
    }
    sqlite3_finalize(statement)
    sqlite3_close(db)
    exit(0)
}
if arguments.count == 3, arguments[1] == "earlier-boot" {
    var db: OpaquePointer?
    let sql = """
        BEGIN IMMEDIATE;
        UPDATE runs SET lease_boot = CASE lease_boot WHEN 1 THEN 2 ELSE 1 END WHERE lease_boot IS NOT NULL;
        UPDATE runs SET wake_boot = CASE wake_boot WHEN 1 THEN 2 ELSE 1 END WHERE wake_boot IS NOT NULL;
        UPDATE history SET deadline_boot = CASE deadline_boot WHEN 1 THEN 2 ELSE 1 END WHERE deadline_boot IS NOT NULL;
        COMMIT;
        """
    guard sqlite3_open(arguments[2], &db) == SQLITE_OK, sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
        FileHandle.standardError.write(Data("cannot move the database to another boot\n".utf8))
        exit(1)
    }
    sqlite3_close(db)
    exit(0)
}
if arguments.count == 5 || arguments.count == 6, arguments[1] == "fill-finished", let count = Int64(arguments[3]),
    let days = Int64(arguments[4]), let subjects = arguments.count == 6 ? Int64(arguments[5]) : 1000, subjects > 0
{
    var db: OpaquePointer?
    let at = Int64(Date().timeIntervalSince1970 * 1000) - days * 86_400_000
    func exec(_ sql: String, _ values: [Int64]) -> Bool {
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK else { return false }
        for (index, value) in values.enumerated() { sqlite3_bind_int64(statement, Int32(index + 1), value) }
        return sqlite3_step(statement) == SQLITE_DONE
    }
    guard sqlite3_open(arguments[2], &db) == SQLITE_OK, exec("BEGIN IMMEDIATE", []),
        exec(
            """
            WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < ?1)
            INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
            SELECT 'archive', 'device-' || (i % ?3), '1', 'completed', ?2, ?2 FROM c
            """, [count, at, subjects]),
        exec(
            """
            WITH RECURSIVE q(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM q WHERE seq < 5)
            INSERT INTO history (run_id, seq, kind, step, at)
            SELECT r.id, q.seq, 'hop', 'step-' || q.seq, ?1 FROM runs r CROSS JOIN q
            WHERE r.id > (SELECT max(id) FROM runs) - ?2
            """, [at, count]),
        exec("COMMIT", [])
    else {
        FileHandle.standardError.write(Data("cannot add runs: \(String(cString: sqlite3_errmsg(db)))\n".utf8))
        exit(1)
    }
    sqlite3_close(db)
    exit(0)
}
if arguments.count == 3, arguments[1] == "no-auto-vacuum" {
    var db: OpaquePointer?
    guard sqlite3_open(arguments[2], &db) == SQLITE_OK,
        sqlite3_exec(db, "PRAGMA auto_vacuum = NONE; VACUUM", nil, nil, nil) == SQLITE_OK
    else {
        FileHandle.standardError.write(Data("cannot rewrite: \(String(cString: sqlite3_errmsg(db)))\n".utf8))
        exit(1)
    }
    sqlite3_close(db)
    exit(0)
}
if arguments.count == 4, arguments[1] == "write-loop", let busy = Int(arguments[3]) {
    let closed = Atomic<Bool>(false)
    Thread.detachNewThread {
        _ = FileHandle.standardInput.readDataToEndOfFile()
        closed.store(true, ordering: .relaxed)
    }
    do {
        let store = try await HopStore.open(path: arguments[2], options: .init(busyTimeout: .milliseconds(busy)))
        // The lowest run id, read on a connection of its own (a read waits for no lock).
        var reader: OpaquePointer?
        var lowest: OpaquePointer?
        guard sqlite3_open_v2(arguments[2], &reader, SQLITE_OPEN_READONLY, nil) == SQLITE_OK,
            sqlite3_prepare_v2(reader, "SELECT coalesce(min(id), 0) FROM runs", -1, &lowest, nil) == SQLITE_OK
        else {
            FileHandle.standardError.write(Data("cannot read the runs\n".utf8))
            exit(1)
        }
        func lowestRun() -> Int64 {
            defer { sqlite3_reset(lowest) }
            return sqlite3_step(lowest) == SQLITE_ROW ? sqlite3_column_int64(lowest, 0) : 0
        }
        FileHandle.standardOutput.write(Data("writing\n".utf8))
        var writes = 0
        var failed = 0
        var longest = Duration.zero
        var passed: Int64 = 0
        let clock = ContinuousClock()
        while !closed.load(ordering: .relaxed) {
            let before = lowestRun()
            let start = clock.now
            do {
                try await store.setFact(subject: "writer", key: "n", value: "\(writes)")
            } catch let error as HopError where error.code == .busy {
                failed += 1
            }
            longest = max(longest, clock.now - start)
            passed = max(passed, lowestRun() - before)
            writes += 1
            try await Task.sleep(for: .milliseconds(2))
        }
        let milliseconds = Double(longest.components.attoseconds) / 1e15 + Double(longest.components.seconds) * 1000
        print("writes \(writes) failed \(failed) longest \(Int(milliseconds.rounded())) passed \(passed)")
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("\(error)\n".utf8))
        exit(1)
    }
}
if arguments.count >= 4, arguments[1] == "peak-memory" {
    var pid: pid_t = 0
    let argv = arguments[3...].map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    let spawned = posix_spawn(&pid, arguments[3], nil, nil, argv, environ)
    guard spawned == 0 else {
        FileHandle.standardError.write(
            Data("cannot start \(arguments[3]): \(String(cString: strerror(spawned)))\n".utf8))
        exit(1)
    }
    var status: Int32 = 0
    var usage = rusage()
    while wait4(pid, &status, 0, &usage) < 0 {
        guard errno == EINTR else { exit(1) }
    }
    guard (try? "\(usage.ru_maxrss)\n".write(toFile: arguments[2], atomically: true, encoding: .utf8)) != nil else {
        FileHandle.standardError.write(Data("cannot write \(arguments[2])\n".utf8))
        exit(1)
    }
    exit((status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f))
}
guard arguments.count == 3, ["migrate", "migrate-newer", "modes", "hold-lock", "hold-read"].contains(arguments[1])
else {
    FileHandle.standardError.write(
        Data("usage: hop-test-store migrate|migrate-newer|modes|hold-lock|hold-read PATH\n".utf8))
    exit(64)
}
if arguments[1] == "hold-lock" || arguments[1] == "hold-read" {
    let reading = arguments[1] == "hold-read"
    // A read transaction takes its snapshot at its first read.
    let begin = reading ? "BEGIN; SELECT count(*) FROM runs;" : "BEGIN IMMEDIATE"
    var db: OpaquePointer?
    guard sqlite3_open(arguments[2], &db) == SQLITE_OK, sqlite3_exec(db, begin, nil, nil, nil) == SQLITE_OK else {
        FileHandle.standardError.write(Data("cannot \(reading ? "read" : "take the write lock")\n".utf8))
        exit(1)
    }
    FileHandle.standardOutput.write(Data((reading ? "reading\n" : "locked\n").utf8))
    _ = FileHandle.standardInput.readDataToEndOfFile()
    sqlite3_exec(db, "ROLLBACK", nil, nil, nil)
    sqlite3_close(db)
    exit(0)
}
do {
    let path = arguments[2]
    var options = HopStore.Options()
    if arguments[1] == "migrate-newer" {
        options.migrations.append(
            Migration(
                version: Migration.latestVersion + 1, name: "later", sql: "CREATE TABLE later (id INTEGER PRIMARY KEY);"
            ))
    }
    let store = try await HopStore.open(path: path, options: options)
    if arguments[1] == "migrate" || arguments[1] == "migrate-newer" {
        print("schema \(store.schemaVersion)")
    } else {
        try await store.setFact(subject: "default", key: "written", value: "yes")
        for file in [path, path + "-wal", path + "-shm"] {
            let mode = (try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int) ?? 0
            print("\(URL(fileURLWithPath: file).lastPathComponent) \(String(mode, radix: 8))")
        }
    }
} catch {
    FileHandle.standardError.write(Data("\(error)\n".utf8))
    exit(1)
}
