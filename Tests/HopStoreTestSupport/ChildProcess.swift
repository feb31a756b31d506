import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A real child process started by a test with `posix_spawn`, its output captured in files.
///
/// Foundation's `Process` is not used: its `run()` over-reads a `dirent` on Linux
/// (swift-corelibs-foundation PR #5472) and crashes a suite that starts many children now and then.
/// The exit status is collected with a non-blocking `waitpid`, so no thread ever blocks on it.
public final class ChildProcess: Sendable {
    private let pid: pid_t
    private let state = Mutex(State())
    public let stdoutPath: String
    public let stderrPath: String
    public let executable: String

    private struct State {
        /// The write end of the child's standard input, while open.
        var input: Int32?
        /// The raw `waitpid` status once the child has been reaped.
        var waitStatus: Int32?
    }

    /// Starts `executable` (a path, or the name of a product built beside the tests).
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        stdin: String? = nil, keepInputOpen: Bool = false, directory: TemporaryDirectory
    ) throws {
        let path = executable.contains("/") ? executable : builtProduct(executable)
        self.executable = path
        let id = UUID().uuidString.prefix(8)
        let name = URL(fileURLWithPath: path).lastPathComponent
        stdoutPath = directory.path("\(name)-\(id).out")
        stderrPath = directory.path("\(name)-\(id).err")
        var env = ProcessInfo.processInfo.environment
        env["HOP_DB"] = nil
        for (key, value) in environment { env[key] = value }

        var pipe: [Int32] = [-1, -1]  // [child's end, test's end]
        // Standard input is one end of a socket pair, both ends created close-on-exec at once, so
        // no child started meanwhile by another test inherits the write end and keeps this child
        // from ever reading its end of input (the child's descriptor 0 is a dup2 copy, without the flag).
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, type, 0, &pipe) == 0 else {
            throw TestFailure("socketpair failed: \(String(cString: strerror(errno)))")
        }
        let pid: pid_t
        do {
            pid = try posixSpawn(path, arguments, environment: env) { [stdoutPath, stderrPath] actions in
                posix_spawn_file_actions_adddup2(&actions, pipe[0], 0)
                posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
                posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            }
            close(pipe[0])
        } catch {
            close(pipe[0])
            close(pipe[1])
            throw error
        }
        self.pid = pid
        if let stdin {
            var bytes = Array(stdin.utf8)[...]
            while !bytes.isEmpty {
                let written = bytes.withUnsafeBytes { send(pipe[1], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { break }  // the child closed its input: it reads no more
                bytes = bytes.dropFirst(written)
            }
        }
        if keepInputOpen {
            state.withLock { $0.input = pipe[1] }
        } else {
            close(pipe[1])
        }
    }

    deinit {
        closeInput()
        // A child still running when its test is done is killed and reaped, never left behind.
        if exitStatus == nil {
            Glibc.kill(pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        }
    }

    /// Closes the process's standard input (for a process started with `keepInputOpen`).
    public func closeInput() {
        if let input = state.withLock({ $0.input.take() }) { close(input) }
    }

    public var processIdentifier: Int32 { pid }

    /// What the process wrote to standard output so far.
    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }

    /// What the process wrote to standard error so far.
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// The raw `waitpid` status once the process has ended; reaps it without waiting.
    private var waitStatus: Int32? {
        state.withLock { state in
            if let status = state.waitStatus { return status }
            var status: Int32 = 0
            let reaped = waitpid(pid, &status, WNOHANG)
            guard reaped == pid else { return nil }
            state.waitStatus = status
            return status
        }
    }

    /// The exit status once the process has ended (the signal number when a signal ended it).
    public var exitStatus: Int32? {
        guard let status = waitStatus else { return nil }
        return status & 0x7f == 0 ? (status >> 8) & 0xff : status & 0x7f
    }

    /// Whether a signal, rather than an exit, ended the process.
    public var wasSignalled: Bool {
        guard let status = waitStatus else { return false }
        return status & 0x7f != 0 && status & 0x7f != 0x7f
    }

    /// Sends `signal` to the process (nothing once it has been reaped: its pid may be reused).
    public func kill(_ signal: Int32 = SIGKILL) {
        guard waitStatus == nil else { return }
        Glibc.kill(pid, signal)
    }

    /// Runs `body`, a wait for what the process must do first, and kills the process if it
    /// throws: a helper that starts a process hands its caller one that got there, or none.
    public func killedIfFails<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch {
            kill()
            throw error
        }
    }

    /// Waits until the process ends, at most `timeout`; returns its exit status.
    @discardableResult
    public func waitForExit(
        timeout: Duration = .seconds(60), file: StaticString = #fileID, line: UInt = #line
    ) async throws -> Int32 {
        try await waitUntil("\(executable) ends", timeout: timeout, file: file, line: line) { self.exitStatus != nil }
        return exitStatus ?? -1
    }

    /// Waits until standard output contains `text`, at most `timeout` (a minute by default, as
    /// ``waitUntil(_:timeout:file:line:_:)``).
    public func waitForOutput(
        _ text: String, timeout: Duration = .seconds(60), file: StaticString = #fileID, line: UInt = #line
    ) async throws {
        try await waitUntil("\(executable) prints \"\(text)\"", timeout: timeout, file: file, line: line) {
            if self.stdout.contains(text) { return true }
            if self.exitStatus != nil {
                throw TestFailure(
                    "\(self.executable) ended before printing \"\(text)\"; stdout:\n\(self.stdout)\nstderr:\n\(self.stderr)"
                )
            }
            return false
        }
    }
}

/// Runs a built product to its end and returns its exit status, standard output and standard error.
public func run(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:], stdin: String? = nil,
    in directory: TemporaryDirectory, timeout: Duration = .seconds(60), file: StaticString = #fileID,
    line: UInt = #line
) async throws -> (status: Int32, stdout: String, stderr: String) {
    let child = try ChildProcess(executable, arguments, environment: environment, stdin: stdin, directory: directory)
    let status = try await child.waitForExit(timeout: timeout, file: file, line: line)
    return (status, child.stdout, child.stderr)
}

/// The path of a product that `swift build` placed beside the test bundle.
public func builtProduct(_ name: String) -> String {
    let executable =
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var folder = URL(fileURLWithPath: executable).deletingLastPathComponent()
    // On Linux the test runner is `<Package>PackageTests.xctest` inside the products folder.
    while !FileManager.default.fileExists(atPath: folder.appendingPathComponent(name).path), folder.path != "/" {
        folder.deleteLastPathComponent()
    }
    return folder.appendingPathComponent(name).path
}
