import Foundation

#if canImport(Glibc)
import Glibc
#endif

// Test helper: a relay between a PostgreSQL client and its server, over Unix sockets, that a
// test freezes (SIGSTOP) to cut the client off from the server while both run on: the client's
// statements wait unanswered and the server sees an idle session that keeps its locks, as in a
// network partition. SIGCONT heals it.
//
// Usage: hop-test-proxy LISTEN TARGET
//   LISTEN  the socket to listen on (for a PostgreSQL client: FOLDER/.s.PGSQL.5432, and the
//           client's host is FOLDER)
//   TARGET  the server's socket
// Prints "listening" once clients may connect; relays each connection until either side closes it.

/// The address of the Unix socket at `path`, or `nil` when the path is too long for one.
func unixAddress(_ path: String) -> sockaddr_un? {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
    return address
}

/// Calls `body` with `address` as the `sockaddr` that `bind` and `connect` take.
func withSocketAddress<T>(_ address: sockaddr_un, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
    var address = address
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("hop-test-proxy: \(message) (errno \(errno))\n".utf8))
    exit(1)
}

/// Writes all `count` bytes of `buffer` to `descriptor`; `false` when the descriptor is closed.
func writeAll(_ descriptor: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Bool {
    var written = 0
    while written < count {
        let result = write(descriptor, buffer + written, count - written)
        if result < 0, errno == EINTR { continue }
        if result <= 0 { return false }
        written += result
    }
    return true
}

/// Copies what either side sends to the other until one of them closes, then closes both.
func relay(_ client: Int32, _ server: Int32) {
    var descriptors = [
        pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: server, events: Int16(POLLIN), revents: 0),
    ]
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: 65536, alignment: 8)
    defer {
        buffer.deallocate()
        close(client)
        close(server)
    }
    while true {
        if poll(&descriptors, 2, -1) < 0 {
            if errno == EINTR { continue }
            return
        }
        for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
            let count = read(descriptor.fd, buffer, 65536)
            if count < 0, errno == EINTR { continue }
            guard count > 0, writeAll(descriptors[1 - index].fd, buffer, count) else { return }
        }
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 3, let listening = unixAddress(arguments[1]), let target = unixAddress(arguments[2]) else {
    fail("usage: hop-test-proxy LISTEN TARGET (socket paths of at most 107 bytes)")
}
signal(SIGPIPE, SIG_IGN)
unlink(arguments[1])
let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
guard listener >= 0 else { fail("cannot make a socket") }
guard withSocketAddress(listening, { bind(listener, $0, $1) }) == 0 else { fail("cannot bind \(arguments[1])") }
guard listen(listener, 64) == 0 else { fail("cannot listen on \(arguments[1])") }
FileHandle.standardOutput.write(Data("listening\n".utf8))
while true {
    let client = accept(listener, nil, nil)
    if client < 0 {
        if errno == EINTR || errno == ECONNABORTED { continue }
        fail("cannot accept a connection")
    }
    let server = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard server >= 0, withSocketAddress(target, { connect(server, $0, $1) }) == 0 else {
        close(client)
        if server >= 0 { close(server) }
        continue  // the server is away: the client sees its connection closed
    }
    Thread.detachNewThread { relay(client, server) }
}
