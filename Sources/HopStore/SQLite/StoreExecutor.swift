#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// A serial executor that runs a ``HopStore``'s work on a thread of its own.
///
/// SQLite calls block: an fsync takes milliseconds, a busy wait up to the busy timeout.
/// Running them here keeps them off Swift's cooperative pool.
final class StoreExecutor: SerialExecutor, @unchecked Sendable {
    // @unchecked: `queue` and `stopping` are only touched while `condition` is locked.
    private let condition = ThreadCondition()
    private var queue: [UnownedJob] = []
    private var blocks: [() -> Void] = []
    private var stopping = false

    /// - Throws: when the system refuses a new thread (too many threads or processes).
    init(name: String) throws {
        try startThread(named: name) { [self] in self.loop() }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        queue.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Runs `block` on the executor's thread and returns its result.
    func perform<T: Sendable>(_ block: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            condition.lock()
            blocks.append { continuation.resume(with: Result { try block() }) }
            condition.signal()
            condition.unlock()
        }
    }

    /// Lets the thread end once the work already queued has run.
    func stop() {
        condition.lock()
        stopping = true
        condition.signal()
        condition.unlock()
    }

    /// How long the thread keeps looking for more work before it sleeps: a flow's next write
    /// usually arrives within microseconds of the last one's result, and catching it here
    /// saves a sleep and a wake-up of the thread per write.
    private static let spin: Duration = .microseconds(50)

    private func loop() {
        while true {
            condition.lock()
            if queue.isEmpty && blocks.isEmpty && !stopping {
                let deadline = ContinuousClock.now.advanced(by: Self.spin)
                while queue.isEmpty && blocks.isEmpty && !stopping && ContinuousClock.now < deadline {
                    condition.unlock()
                    sched_yield()
                    condition.lock()
                }
            }
            while queue.isEmpty && blocks.isEmpty && !stopping {
                condition.wait()
            }
            if queue.isEmpty && blocks.isEmpty {
                condition.unlock()
                return
            }
            let jobs = queue
            let work = blocks
            queue.removeAll(keepingCapacity: true)
            blocks.removeAll(keepingCapacity: true)
            condition.unlock()
            for block in work { block() }
            for job in jobs { job.runSynchronously(on: asUnownedSerialExecutor()) }
        }
    }
}

/// A mutex and its condition variable (pthread's), for the store's thread and those handing it work.
final class ThreadCondition: @unchecked Sendable {
    // @unchecked: the pthread objects are used only through their own locking calls.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let variable = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(variable, nil)
    }

    deinit {
        pthread_cond_destroy(variable)
        pthread_mutex_destroy(mutex)
        variable.deallocate()
        mutex.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    /// Waits, with the lock held, until signalled (or spuriously woken: check the condition again).
    func wait() { pthread_cond_wait(variable, mutex) }
    func signal() { pthread_cond_signal(variable) }
}

/// Starts a detached thread that runs `body`; `name` says whose it is in an error.
private func startThread(named name: String, _ body: @escaping @Sendable () -> Void) throws {
    final class Box {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
    let context = Unmanaged.passRetained(Box(body)).toOpaque()
    var thread = pthread_t()
    let started = pthread_create(
        &thread, nil,
        { context in
            guard let context else { return nil }
            let box = Unmanaged<Box>.fromOpaque(context).takeRetainedValue()
            box.body()
            return nil
        }, context)
    guard started == 0 else {
        Unmanaged<Box>.fromOpaque(context).release()
        throw HopError(
            .cannotOpen, operation: "open", path: "",
            reason:
                "the thread \(name) cannot be started (pthread_create returned \(started): the system limits threads)",
            hint: "Raise the process's thread limit (ulimit -u, systemd TasksMax=) or run fewer processes")
    }
    pthread_detach(thread)
}
