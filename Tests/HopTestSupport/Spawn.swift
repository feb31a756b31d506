import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs `executable` with `arguments` to its end on the calling thread, with standard input
/// from /dev/null and standard output and error captured: a lean `posix_spawn` + `waitpid`
/// for tests that start thousands of processes (Foundation's Process keeps descriptors and
/// memory per process). Blocks: call it from a thread of the test's own, never from a task.
public func spawnAndWait(_ executable: String, _ arguments: [String], scratch: String) throws -> (status: Int32, stdout: String, stderr: String) {
    let outPath = scratch + ".out"
    let errPath = scratch + ".err"
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard spawned == 0 else { throw TestFailure("cannot start \(executable): \(String(cString: strerror(spawned)))") }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
        guard errno == EINTR else { throw TestFailure("waitpid failed: \(String(cString: strerror(errno)))") }
    }
    let exited = (status & 0x7f) == 0
    let code = exited ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    let stdout = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
    let stderr = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
    return (code, stdout, stderr)
}

/// Runs `body` on a thread of its own and returns its result: for blocking work in async tests.
public func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}
