#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

#if canImport(Glibc)
import Glibc
#endif

/// One start of an engine: the identity under which it owns runs, and the proof that it is alive.
///
/// A run's owner is an incarnation, never a configured name: two processes given the same
/// label (`"hop-demo@kiosk-17"`) are two incarnations, so neither ever executes a run the
/// other holds, and a process restarted with the same label is a new incarnation that can prove
/// the old one dead and take its runs back at once.
///
/// The proof is a lock the kernel releases when the process dies: each incarnation holds an
/// exclusive `flock(2)` lock on a file of its own in the folder `<database>-engines/`, for as
/// long as it lives. Another engine that can take that lock knows the owner is gone (a frozen
/// process keeps its lock: it is alive, and its runs are taken over only when their leases
/// expire). Where the folder cannot be written, the incarnation has no lock and its runs are
/// taken over when their leases expire. On a shared server database the same role falls to a
/// lock that the server drops with the owner's connection (a session-level advisory lock).
public final class Incarnation: Sendable {
    /// The owner value stored in `runs.owner`: the label, `#`, and 16 random hex digits.
    public let id: String
    /// The readable label the engine was configured with (shown by `hopctl status`).
    public let label: String
    /// The locked file's descriptor, open (and locked) for the incarnation's whole life.
    private let lockDescriptor: Int32?
    /// A server backend's proof of liveness (the connection holding its advisory lock), kept for
    /// the incarnation's whole life and let go of with it.
    private let serverLock: (any Sendable)?

    /// Whether other engines can prove this incarnation dead by its lock.
    public var canProveLiveness: Bool { lockDescriptor != nil || serverLock != nil }

    /// A new incarnation labelled `label` for the database at `databasePath`, holding its
    /// liveness lock when the lock folder can be written.
    init(label: String, databasePath: String) {
        self.label = label
        let id = Self.makeID(label: label)
        self.id = id
        lockDescriptor = try? LivenessLocks(databasePath: databasePath).lock(incarnation: id)
        serverLock = nil
    }

    /// A new incarnation labelled `label` with the owner value `id` (made by ``makeID(label:)``),
    /// whose proof of liveness is `serverLock`: a lock that a server drops with the connection
    /// holding it, kept for as long as the incarnation lives.
    package init(label: String, id: String, serverLock: any Sendable) {
        self.label = label
        self.id = id
        self.lockDescriptor = nil
        self.serverLock = serverLock
    }

    /// A new owner value for an incarnation labelled `label`: the label, `#`, and 16 random hex digits.
    package static func makeID(label: String) -> String { "\(label)#\(Token.random(byteCount: 8))" }

    deinit {
        // Closing the descriptor releases the lock: the file stays for another engine to find,
        // prove dead and remove, releasing any run this incarnation still holds.
        if let lockDescriptor { close(lockDescriptor) }
    }

    /// The label part of an owner value written by ``id`` (the whole value for an older owner).
    public static func label(of owner: String) -> String {
        guard let hash = owner.lastIndex(of: "#") else { return owner }
        return String(owner[..<hash])
    }
}

/// The folder of liveness lock files beside a database: one `<random>.lock` file per live (or
/// not yet reaped) incarnation, holding the incarnation's owner value.
struct LivenessLocks {
    let folder: String

    init(databasePath: String) { folder = databasePath + "-engines" }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Creates and locks the file of `incarnation`, then publishes it under its final name, so
    /// that no other engine ever sees the file unlocked while its incarnation lives.
    func lock(incarnation: String) throws -> Int32 {
        if mkdir(folder, 0o700) != 0 && errno != EEXIST { throw failure("create") }
        let name = String(incarnation.suffix(16))
        let temporary = "\(folder)/.\(name).tmp"
        let final = "\(folder)/\(name).lock"
        let descriptor = open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw failure("create a lock file in") }
        var bytes = Array(incarnation.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else { break }
            bytes = bytes.dropFirst(written)
        }
        guard bytes.isEmpty, flock(descriptor, LOCK_EX | LOCK_NB) == 0, rename(temporary, final) == 0 else {
            let error = failure("lock a file in")
            unlink(temporary)
            close(descriptor)
            throw error
        }
        return descriptor
    }

    /// The owner values of the incarnations whose lock files are no longer locked: their
    /// processes are gone. Each file stays locked by the caller until `forget` is called with it.
    func dead(except own: String) -> [(owner: String, descriptor: Int32, file: String)] {
        guard let directory = opendir(folder) else { return [] }
        defer { closedir(directory) }
        var found: [(String, Int32, String)] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard name.hasSuffix(".lock"), name.count == 21, !own.hasSuffix("#" + name.prefix(16)) else { continue }
            let file = "\(folder)/\(name)"
            let descriptor = open(file, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else { continue }
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
                close(descriptor)  // locked: its incarnation is alive (perhaps frozen)
                continue
            }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
            let owner = count > 0 ? String(decoding: buffer[0..<count], as: UTF8.self) : ""
            found.append((owner, descriptor, file))
        }
        return found
    }

    /// Removes a dead incarnation's file (its runs released) and lets go of its lock.
    func forget(file: String, descriptor: Int32) {
        unlink(file)
        close(descriptor)
    }

    private func failure(_ what: String) -> Failure {
        Failure(description: "cannot \(what) the folder \(folder): \(String(cString: strerror(errno)))")
    }
}
