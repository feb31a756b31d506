import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Tells systemd how a `Type=notify` service is doing (`READY=1`, `STATUS=…`, `STOPPING=1`),
/// through the datagram socket named by `$NOTIFY_SOCKET`: the `sd_notify` protocol, without libsystemd.
///
/// ```swift
/// let systemd = SystemdNotifier()          // nil when not started by systemd
/// systemd?.notify("READY=1")
/// ```
public struct SystemdNotifier: Sendable {
    /// The socket's address: a path, or an abstract name starting with "@".
    public let socketPath: String

    /// A notifier for `$NOTIFY_SOCKET`; `nil` when the variable is not set (not run by systemd).
    public init?(environment: [String: String] = ProcessInfo.processInfo.environment) {
        guard let path = environment["NOTIFY_SOCKET"], !path.isEmpty else { return nil }
        socketPath = path
    }

    /// Sends `state`, e.g. `"READY=1"` or `"STATUS=at onboarding"`. Returns whether it was sent;
    /// a failure is not an error for the daemon (systemd may not be listening).
    @discardableResult
    public func notify(_ state: String) -> Bool {
        #if os(Linux)
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(socketPath.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (index, byte) in bytes.enumerated() { buffer[index] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        let message = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                sendto(descriptor, message, message.count, Int32(MSG_NOSIGNAL), socketAddress, length)
            }
        }
        return sent == message.count
        #else
        return false
        #endif
    }
}
