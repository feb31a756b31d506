import Foundation

/// A serial executor that runs a ``HopStore``'s work on a thread of its own.
///
/// SQLite calls block: an fsync takes milliseconds, a busy wait up to the busy timeout.
/// Running them here keeps them off Swift's cooperative pool.
final class StoreExecutor: SerialExecutor, @unchecked Sendable {
    // @unchecked: `queue` and `stopping` are only touched while `condition` is locked.
    private let condition = NSCondition()
    private var queue: [UnownedJob] = []
    private var blocks: [() -> Void] = []
    private var stopping = false

    init(name: String) {
        let thread = Thread { [self] in self.loop() }
        thread.name = name
        thread.start()
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
