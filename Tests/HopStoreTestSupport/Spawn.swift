import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs `executable` with `arguments` to its end on the calling thread, with standard input
/// from /dev/null and standard output and error captured: a lean `posix_spawn` + `waitpid`
/// for tests that start thousands of processes (Foundation's Process keeps descriptors and
/// memory per process). Blocks: call it from a thread of the test's own, never from a task.
public func spawnAndWait(
    _ executable: String, _ arguments: [String], scratch: String
) throws -> (status: Int32, stdout: String, stderr: String) {
    let outPath = scratch + ".out"
    let errPath = scratch + ".err"
    let pid = try posixSpawn(executable, arguments, environment: ProcessInfo.processInfo.environment) { actions in
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    }
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

/// Starts `executable` with `posix_spawn`: `configure` sets up descriptors 0, 1 and 2; every
/// other descriptor of the test process is closed in the child (a file another test is writing
/// stays writable only there), signals start unblocked with default dispositions, and a start
/// refused with "Text file busy" (a binary another thread has just copied) is tried again.
public func posixSpawn(
    _ executable: String, _ arguments: [String], environment: [String: String],
    configure: (inout posix_spawn_file_actions_t) -> Void
) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    configure(&actions)
    if let closeFrom = closeFromAction { _ = closeFrom(&actions, 3) }
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var signals = sigset_t()
    sigemptyset(&signals)
    posix_spawnattr_setsigmask(&attributes, &signals)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD] { sigaddset(&defaults, signal) }
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for pointer in envp { free(pointer) } }
    var pid: pid_t = 0
    let deadline = ContinuousClock.now.advanced(by: .seconds(5))
    while true {
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        if spawned == 0 {
            yieldToTheTestProcess(pid)
            return pid
        }
        guard spawned == ETXTBSY, ContinuousClock.now < deadline else {
            throw TestFailure("cannot start \(executable): \(String(cString: strerror(spawned)))")
        }
        usleep(1000)  // another child holds the fresh copy open for writing until it execs
    }
}

/// The niceness of every process a test starts (and of what it starts in turn): the test
/// process itself, whose engines and waits also have deadlines, runs ahead of them. The suite
/// starts a few hundred processes while a few hundred tests run in this one; at equal priority
/// its few threads got a small share of two cores, and its engines' polls and its waits came
/// seconds late.
let childrenNiceness: Int32 = 5

/// Gives process `pid`, just started, at least ``childrenNiceness`` (a thread that lowered its
/// priority further passes its own on). Set at once, in practice before the child has started a
/// thread of its own (it is still loading its libraries): its threads and its children inherit
/// it. A thread started before would keep the usual priority: a scheduling hint, not a guarantee.
private func yieldToTheTestProcess(_ pid: pid_t) {
    let which = __priority_which_t(PRIO_PROCESS.rawValue)
    errno = 0
    let own = getpriority(which, 0)  // the calling thread's, on Linux
    _ = setpriority(which, id_t(pid), max(errno == 0 ? own : 0, childrenNiceness))
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later), which Swift's Glibc
/// module does not declare.
private let closeFromAction: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        return nil
    }
    return unsafeBitCast(
        symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
}()

/// Runs `body` on a thread of its own and returns its result: for blocking work in async tests.
public func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// Lowers the calling thread's scheduling priority to `niceness` (0 to 19); the processes it
/// starts from then on inherit it. For a thread of a test's own that is a load in the
/// background (the soak's operators): the tests beside it that wait for something with a
/// deadline get the processors first, and the load takes what is left.
public func lowerThisThreadsPriority(to niceness: Int32) {
    guard let gettid = threadID else { return }
    _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(gettid()), niceness)
}

/// glibc's `gettid` (2.30 and later), which Swift's Glibc module does not declare.
private let threadID: (@convention(c) () -> pid_t)? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "gettid") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) () -> pid_t).self)
}()
