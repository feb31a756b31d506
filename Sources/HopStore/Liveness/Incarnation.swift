import Synchronization

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
///
/// Beside its lock, an incarnation on a file keeps a heartbeat that says it is waiting for the
/// file's write lock (``beat(for:)``): an owner that could not renew its leases only because
/// another process held that lock is alive and not frozen, and keeps its runs.
public final class Incarnation: Sendable {
    /// The owner value stored in `runs.owner`: the label, `#`, and 16 random hex digits.
    public let id: String
    /// The readable label the engine was configured with (shown by `hopctl status`).
    public let label: String
    /// The locked file's descriptor, open (and locked) for the incarnation's whole life.
    private let lockDescriptor: Int32?
    /// The heartbeat file's descriptor (see ``LivenessLocks``), open for the incarnation's whole life.
    private let beatDescriptor: Int32?
    /// Until when the heartbeat last written holds, by this process's monotonic clock (read
    /// before it was written: it holds no shorter than that in the file).
    private let beatHolds = Mutex<ContinuousClock.Instant?>(nil)
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
        let locks = LivenessLocks(databasePath: databasePath)
        let lockDescriptor = try? locks.lock(incarnation: id)
        self.lockDescriptor = lockDescriptor
        beatDescriptor = lockDescriptor == nil ? nil : locks.openBeat(incarnation: id)
        serverLock = nil
    }

    /// A new incarnation labelled `label` with the owner value `id` (made by ``makeID(label:)``),
    /// whose proof of liveness is `serverLock`: a lock that a server drops with the connection
    /// holding it, kept for as long as the incarnation lives.
    package init(label: String, id: String, serverLock: any Sendable) {
        self.label = label
        self.id = id
        self.lockDescriptor = nil
        self.beatDescriptor = nil
        self.serverLock = serverLock
    }

    /// A new owner value for an incarnation labelled `label`: the label, `#`, and 16 random hex digits.
    package static func makeID(label: String) -> String { "\(label)#\(Token.random(byteCount: 8))" }

    deinit {
        // Closing the descriptor releases the lock: the file stays for another engine to find,
        // prove dead and remove, releasing any run this incarnation still holds.
        if let beatDescriptor { close(beatDescriptor) }
        if let lockDescriptor { close(lockDescriptor) }
    }

    /// Says in the incarnation's heartbeat that it waits for the database file's write lock
    /// (another process holds it), for the next `duration` by the machine's uptime clock.
    /// Nothing where the incarnation has no heartbeat (no lock file, or a server's lock).
    func beat(for duration: Duration) {
        guard let beatDescriptor, let boot = UptimeClock.machine.boot else { return }
        let now = ContinuousClock.now
        let until = UptimeClock.uptimeMilliseconds() + Int64(duration / .milliseconds(1))
        guard LivenessLocks.store(LivenessLocks.Beat(boot: boot, until: until), in: beatDescriptor) else { return }
        beatHolds.withLock { $0 = max($0 ?? now + duration, now + duration) }
    }

    /// Until when (by this process's monotonic clock, less `margin`) the heartbeat keeps other
    /// engines from taking this incarnation's runs whose leases expired, because it says that
    /// the incarnation waits for the file's write lock; `nil` when no heartbeat was written.
    package func heartbeatHolds(lessMargin margin: Duration) -> ContinuousClock.Instant? {
        beatHolds.withLock { $0 }.map { $0 - margin }
    }

    /// The label part of an owner value written by ``id`` (the whole value for an older owner).
    public static func label(of owner: String) -> String {
        guard let hash = owner.lastIndex(of: "#") else { return owner }
        return String(owner[..<hash])
    }
}

/// The folder of liveness lock files beside a database: one `<random>.lock` file per live (or
/// not yet reaped) incarnation, holding the incarnation's owner value, and its heartbeat,
/// `<random>.beat`.
///
/// The heartbeat tells an owner that waits for the file's write lock from one that is frozen.
/// SQLite has one write lock per file: a process that holds it for longer than a lease (an
/// operator's `sqlite3` session or `VACUUM`, a writer frozen in the middle of a commit) keeps
/// every engine from renewing its leases, and once it lets go, the first engine to write found
/// the other engines' leases expired and took their runs over while their steps ran on. So an
/// engine that waits for the lock says so every quarter of a second (`BusyWait`), for the next
/// ``beatLasts``, and a claim takes a run whose lease expired only from an owner whose
/// heartbeat is not fresh (`hop_owner_waits` in the claim's SQL): frozen, dead, or no longer
/// trying to write. Its record is 34 bytes of text, the boot and the uptime in milliseconds
/// until which it holds, each 16 hex digits (`cat` shows it); a heartbeat of another boot holds
/// nothing.
struct LivenessLocks {
    let folder: String

    init(databasePath: String) { folder = databasePath + "-engines" }

    /// The lock file of the incarnation whose name (the last 16 hex digits of its owner value)
    /// is `name`.
    func lockFile(_ name: some StringProtocol) -> String { "\(folder)/\(name).lock" }

    /// The heartbeat file of the incarnation whose name is `name` (see ``lockFile(_:)``).
    func beatFile(_ name: some StringProtocol) -> String { "\(folder)/\(name).beat" }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Creates and locks the file of `incarnation`, then publishes it under its final name, so
    /// that no other engine ever sees the file unlocked while its incarnation lives.
    func lock(incarnation: String) throws -> Int32 {
        if mkdir(folder, 0o700) != 0 && errno != EEXIST { throw failure("create") }
        let name = String(incarnation.suffix(16))
        let temporary = "\(folder)/.\(name).tmp"
        let final = lockFile(name)
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
    func dead(except own: String) -> [(owner: String, descriptor: Int32, name: String)] {
        guard let directory = opendir(folder) else { return [] }
        defer { closedir(directory) }
        var found: [(String, Int32, String)] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name.hasSuffix(".beat"), name.count == 21, access(lockFile(name.prefix(16)), F_OK) != 0 {
                unlink(beatFile(name.prefix(16)))  // an incarnation's heartbeat left by a release that did not know it
                continue
            }
            guard name.hasSuffix(".lock"), name.count == 21, !own.hasSuffix("#" + name.prefix(16)) else { continue }
            let descriptor = open(lockFile(name.prefix(16)), O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else { continue }
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
                close(descriptor)  // locked: its incarnation is alive (perhaps frozen)
                continue
            }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
            let owner = count > 0 ? String(decoding: buffer[0..<count], as: UTF8.self) : ""
            found.append((owner, descriptor, String(name.prefix(16))))
        }
        return found
    }

    /// Removes the lock file of dead incarnation `name` (its runs released) and its heartbeat,
    /// and lets go of its lock.
    func forget(name: String, descriptor: Int32) {
        unlink(beatFile(name))
        unlink(lockFile(name))
        close(descriptor)
    }

    /// How long a heartbeat holds: longer than the pause between two waits of an engine whose
    /// renewals keep failing busy (``HopEngine``'s renewal retry, half a second), short enough
    /// that a frozen owner's heartbeat is soon stale.
    static let beatLasts = Duration.seconds(2)

    /// A heartbeat: the boot it was written in, and the uptime (milliseconds) until which it holds.
    struct Beat: Equatable {
        var boot: Int64
        var until: Int64
    }

    /// Opens (creating it, mode 0600) the heartbeat file of `incarnation`; `nil` when it cannot.
    func openBeat(incarnation: String) -> Int32? {
        let descriptor = open(beatFile(incarnation.suffix(16)), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        return descriptor >= 0 ? descriptor : nil
    }

    /// Writes `beat` over the heartbeat in the open file `descriptor` (one `pwrite` of 34 bytes);
    /// whether it was written (a failure leaves the heartbeat as it was).
    @discardableResult
    static func store(_ beat: Beat, in descriptor: Int32) -> Bool {
        func hex(_ value: Int64) -> String {
            let digits = String(UInt64(bitPattern: value), radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }
        let record = Array("\(hex(beat.boot)) \(hex(beat.until))\n".utf8)
        return record.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) } == record.count
    }

    /// The heartbeat of the incarnation whose owner value is `owner`; `nil` when it has none
    /// (another host's, an older release's, or an unreadable one).
    func beat(of owner: String) -> Beat? {
        guard let hash = owner.lastIndex(of: "#") else { return nil }
        let name = owner[owner.index(after: hash)...]
        guard name.count == 16, name.allSatisfy(\.isHexDigit) else { return nil }
        let descriptor = open(beatFile(name), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 34)
        let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        guard count == 34 else { return nil }
        let fields = buffer.split(separator: UInt8(ascii: " "))
        guard fields.count == 2,
            let boot = UInt64(String(decoding: fields[0], as: UTF8.self), radix: 16),
            let until = UInt64(String(decoding: fields[1].prefix(16), as: UTF8.self), radix: 16)
        else { return nil }
        return Beat(boot: Int64(bitPattern: boot), until: Int64(bitPattern: until))
    }

    /// Whether the incarnation whose owner value is `owner` waits for the file's write lock: its
    /// heartbeat was written in this boot and holds at this uptime.
    func waits(_ owner: String) -> Bool {
        guard let beat = beat(of: owner), let boot = UptimeClock.machine.boot else { return false }
        return beat.boot == boot && beat.until >= UptimeClock.uptimeMilliseconds()
    }

    private func failure(_ what: String) -> Failure {
        Failure(description: "cannot \(what) the folder \(folder): \(String(cString: strerror(errno)))")
    }
}

/// The incarnations made over one database file's store, whose heartbeats say that the store
/// waits for the file's write lock (its connection's busy handler calls ``beat()``).
final class Heartbeats: Sendable {
    private struct Held: Sendable {
        weak var incarnation: Incarnation?
    }
    private let held = Mutex<[Held]>([])

    func add(_ incarnation: Incarnation) {
        held.withLock { held in
            held.removeAll { $0.incarnation == nil }
            held.append(Held(incarnation: incarnation))
        }
    }

    /// Says in the heartbeat of each incarnation still alive that it waits for the write lock.
    func beat() {
        let alive = held.withLock { $0.compactMap(\.incarnation) }
        for incarnation in alive { incarnation.beat(for: LivenessLocks.beatLasts) }
    }
}

/// The SQL function `hop_owner_waits(owner)` of a store's connection: 1 when the incarnation
/// `owner` waits for the file's write lock (``LivenessLocks/waits(_:)``), else 0. Used on the
/// store's thread only.
final class OwnerWaits {
    let locks: LivenessLocks
    /// The answers given during the claim in progress: its statements must agree on whom it
    /// takes a run from, though a heartbeat may be written between two of them.
    private var kept: [String: Bool]?

    init(databasePath: String) { locks = LivenessLocks(databasePath: databasePath) }

    func answer(_ owner: String?) -> Int64 {
        guard let owner else { return 0 }
        if let known = kept?[owner] { return known ? 1 : 0 }
        let waits = locks.waits(owner)
        kept?[owner] = waits
        return waits ? 1 : 0
    }

    /// Runs `body` (a claim's statements) with one answer per owner.
    func keepingAnswers<T>(_ body: () throws -> T) rethrows -> T {
        kept = [:]
        defer { kept = nil }
        return try body()
    }
}
