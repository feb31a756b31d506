import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs `executable` to its end with `posix_spawn`: standard input from /dev/null, standard
/// output to `stdoutPath` (or /dev/null), standard error to `stderrPath`. Returns the exit status
/// (128 + the signal number when a signal ended it).
///
/// Foundation's `Process` is not used: its `run()` over-reads a `dirent` on Linux
/// (swift-corelibs-foundation PR #5472) and crashes now and then. Blocks the calling thread.
func spawnAndWait(_ executable: String, _ arguments: [String], stdoutPath: String?, stderrPath: String) throws -> Int32
{
    try waitForChild(try spawn(executable, arguments, stdoutPath: stdoutPath, stderrPath: stderrPath))
}

/// Starts this benchmark's executable with `arguments` (a scenario's part in a process of its own).
func spawnChild(_ arguments: [String], stdoutPath: String, stderrPath: String) throws -> pid_t {
    try spawn(Scenarios.executablePath, arguments, stdoutPath: stdoutPath, stderrPath: stderrPath)
}

/// Starts `executable` as ``spawnAndWait(_:_:stdoutPath:stderrPath:)`` does, without waiting.
func spawn(_ executable: String, _ arguments: [String], stdoutPath: String?, stderrPath: String) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, stdoutPath ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard spawned == 0 else { throw BenchError("cannot start \(executable): \(String(cString: strerror(spawned)))") }
    return pid
}

/// Waits for child `pid` to end; returns its exit status (128 + the signal number when a signal
/// ended it). Blocks the calling thread.
func waitForChild(_ pid: pid_t) throws -> Int32 {
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
        guard errno == EINTR else { throw BenchError("waitpid failed: \(String(cString: strerror(errno)))") }
    }
    return status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
}
