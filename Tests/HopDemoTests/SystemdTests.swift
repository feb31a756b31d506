import Foundation
import HopTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The demo under systemd's `Type=notify` protocol, with this test as systemd.
@Suite struct SystemdTests {
    /// A datagram socket standing in for systemd's notify socket.
    final class NotifySocket {
        let descriptor: Int32
        let path: String

        init(path: String) throws {
            self.path = path
            descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            let bytes = Array(path.utf8)
            withUnsafeMutableBytes(of: &address.sun_path) { buffer in
                for (index, byte) in bytes.enumerated() { buffer[index] = byte }
            }
            let bound = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            guard descriptor >= 0, bound == 0 else { throw TestFailure("cannot bind \(path): errno \(errno)") }
        }

        deinit { close(descriptor) }

        /// The messages received so far.
        func receive() -> [String] {
            var messages: [String] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = recv(descriptor, &buffer, buffer.count, 0)
                guard count > 0 else { return messages }
                messages.append(String(decoding: buffer[0..<count], as: UTF8.self))
            }
        }
    }

    @Test func theDemoReportsReadyAfterResumingAndTheCurrentStepAsItsStatus() async throws {
        let folder = try TemporaryDirectory()
        let socket = try NotifySocket(path: folder.path("notify.sock"))
        let demo = try ChildProcess(
            "hop-demo", ["--db", folder.database], environment: ["NOTIFY_SOCKET": socket.path], directory: folder)
        defer { demo.kill() }
        var messages: [String] = []
        try await waitUntil("the demo reports onboarding as its status") {
            messages += socket.receive()
            return messages.contains("STATUS=startup for default at onboarding")
        }
        #expect(messages.contains("READY=1"))
        #expect(messages.contains("STATUS=startup for default at splash"))
        demo.kill(SIGTERM)
        #expect(try await demo.waitForExit() == 0)
        messages += socket.receive()
        #expect(messages.last == "STOPPING=1")
    }

    /// The unit in Examples/ as an operator installs it: an unprivileged user, hardened, no --auto.
    @Test func theShippedUnitRunsAsAnUnprivilegedUserHardenedAndWaitsForRealLogins() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let unit = root.appendingPathComponent("Examples/StartupDaemon/hop-demo.service").path
        let settings = try String(contentsOfFile: unit, encoding: .utf8).split(separator: "\n")
            .filter { !$0.hasPrefix("#") && $0.contains("=") }.map(String.init)
        let execStart = try #require(settings.first { $0.hasPrefix("ExecStart=") })
        #expect(!execStart.contains("--auto"), "a service waits for real logins")
        for required in [
            "User=hop-demo", "StateDirectory=hop-demo", "UMask=0077", "NoNewPrivileges=yes", "ProtectSystem=strict",
            "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes", "RestrictAddressFamilies=AF_UNIX",
            "SystemCallFilter=@system-service", "CapabilityBoundingSet=",
        ] {
            #expect(settings.contains(required), "the unit lacks \(required)")
        }
        // systemd's own rating, where systemd is installed (Debian's `systemd` package).
        guard
            let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first(where: {
                FileManager.default.isExecutableFile(atPath: $0)
            })
        else { return }
        let folder = try TemporaryDirectory()
        let result = try await run(analyze, ["security", "--offline=yes", "--no-pager", unit], in: folder)
        let overall = try #require(
            result.stdout.split(separator: "\n").first { $0.contains("Overall exposure level") }, "\(result)")
        let score = overall.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }
        #expect((score ?? 10) <= 1.0, "\(overall)")
    }
}
