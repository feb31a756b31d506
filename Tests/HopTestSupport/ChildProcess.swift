import Foundation
import Synchronization

/// A real child process started by a test, with its output captured in files.
public final class ChildProcess: Sendable {
    private let process: SendableProcess
    private let exit = ExitStatus()
    public let stdoutPath: String
    public let stderrPath: String
    public let executable: String

    /// Starts `executable` (a path, or the name of a product built beside the tests).
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        stdin: String? = nil, keepInputOpen: Bool = false, directory: TemporaryDirectory
    ) throws {
        let path = executable.contains("/") ? executable : builtProduct(executable)
        self.executable = path
        let id = UUID().uuidString.prefix(8)
        stdoutPath = directory.path("\(URL(fileURLWithPath: path).lastPathComponent)-\(id).out")
        stderrPath = directory.path("\(URL(fileURLWithPath: path).lastPathComponent)-\(id).err")
        _ = FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env["HOP_DB"] = nil
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: stdoutPath))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: stderrPath))
        let input = Pipe()
        process.standardInput = input
        self.process = SendableProcess(process)
        process.terminationHandler = { [exit] finished in
            exit.value.withLock { $0 = finished.terminationStatus }
        }
        try process.run()
        if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
        self.input = input.fileHandleForWriting
        if !keepInputOpen { try input.fileHandleForWriting.close() }
    }

    private let input: FileHandle

    /// Closes the process's standard input (for a process started with `keepInputOpen`).
    public func closeInput() {
        try? input.close()
    }

    public var processIdentifier: Int32 { process.value.processIdentifier }

    /// What the process wrote to standard output so far.
    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }

    /// What the process wrote to standard error so far.
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// The exit status once the process has ended (the signal number when a signal ended it).
    public var exitStatus: Int32? { exit.value.withLock { $0 } }

    /// Whether a signal, rather than an exit, ended the process.
    public var wasSignalled: Bool { process.value.terminationReason == .uncaughtSignal }

    /// Sends `signal` to the process.
    public func kill(_ signal: Int32 = SIGKILL) {
        Foundation.kill(process.value.processIdentifier, signal)
    }

    /// Waits until the process ends, at most `timeout`; returns its exit status.
    @discardableResult
    public func waitForExit(timeout: Duration = .seconds(60)) async throws -> Int32 {
        try await waitUntil("\(executable) ends", timeout: timeout) { self.exitStatus != nil }
        return exitStatus ?? -1
    }

    /// Waits until standard output contains `text`, at most `timeout`.
    public func waitForOutput(_ text: String, timeout: Duration = .seconds(30)) async throws {
        try await waitUntil("\(executable) prints \"\(text)\"", timeout: timeout) {
            if self.stdout.contains(text) { return true }
            if self.exitStatus != nil { throw TestFailure("\(self.executable) ended before printing \"\(text)\"; stdout:\n\(self.stdout)\nstderr:\n\(self.stderr)") }
            return false
        }
    }
}

private final class ExitStatus: Sendable {
    let value = Mutex<Int32?>(nil)
}

/// Process from Foundation, used only through its thread-safe members.
private struct SendableProcess: @unchecked Sendable {
    // @unchecked: Process is configured before `run()` and afterwards only queried
    // (pid, termination reason), which Foundation guards internally.
    let value: Process
    init(_ value: Process) { self.value = value }
}

/// Runs a built product to its end and returns its exit status, standard output and standard error.
public func run(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:], stdin: String? = nil,
    in directory: TemporaryDirectory, timeout: Duration = .seconds(60)
) async throws -> (status: Int32, stdout: String, stderr: String) {
    let child = try ChildProcess(executable, arguments, environment: environment, stdin: stdin, directory: directory)
    let status = try await child.waitForExit(timeout: timeout)
    return (status, child.stdout, child.stderr)
}

/// The path of a product that `swift build` placed beside the test bundle.
public func builtProduct(_ name: String) -> String {
    let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var folder = URL(fileURLWithPath: executable).deletingLastPathComponent()
    // On Linux the test runner is `<Package>PackageTests.xctest` inside the products folder.
    while !FileManager.default.fileExists(atPath: folder.appendingPathComponent(name).path), folder.path != "/" {
        folder.deleteLastPathComponent()
    }
    return folder.appendingPathComponent(name).path
}
