#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

/// The store's thread: a serial executor that runs a ``HopStore``'s work, and a task executor
/// (``flowExecutor``) on which the engine runs flow bodies, on one thread of its own.
///
/// SQLite calls block: an fsync takes milliseconds, a busy wait up to the busy timeout.
/// Running them here keeps them off Swift's cooperative pool. A flow body that runs here too
/// reaches the store without a thread hand-off: its calls and their results are jobs of this
/// thread's queue, where on the cooperative pool each would wake a thread and put another to
/// sleep (the engine runs steps on the pool: they are the daemon's work, which may block).
final class StoreExecutor: SerialExecutor, @unchecked Sendable {
    // @unchecked: its only state is the queue, which locks.
    private let jobs: JobQueue
    /// The task executor that runs flow bodies on this thread (`Task(executorPreference:)`).
    let flowExecutor: FlowExecutor

    /// - Throws: when the system refuses a new thread (too many threads or processes).
    init(name: String) throws {
        let jobs = JobQueue()
        self.jobs = jobs
        flowExecutor = FlowExecutor(jobs: jobs)
        try startThread(named: name) { jobs.loop() }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        jobs.append(.isolated(UnownedJob(job), asUnownedSerialExecutor()))
    }

    /// Runs `block` on the executor's thread and returns its result.
    func perform<T: Sendable>(_ block: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            jobs.append(.block { continuation.resume(with: Result { try block() }) })
        }
    }

    /// Runs `work` as a job of `flowExecutor` once `delay` has passed, in place of the work
    /// an earlier call set that has not run yet. The thread waits for it itself: no task
    /// sleeps, so no timer thread wakes it. A timer not yet due when the thread stops never runs.
    func setTimer(after delay: Duration, _ work: @escaping @Sendable () async -> Void) {
        let executor = flowExecutor
        jobs.setTimer(at: ContinuousClock.now.advanced(by: delay)) {
            Task(executorPreference: executor) { await work() }
        }
    }

    /// Lets the thread end once the work already queued has run.
    func stop() { jobs.stop() }

    /// The task executor side of the store's thread: jobs of tasks that prefer it and are not
    /// isolated to an actor of their own (a flow body, the engine's run bookkeeping).
    final class FlowExecutor: TaskExecutor, @unchecked Sendable {
        // @unchecked: it only hands jobs to the queue, which locks.
        private let jobs: JobQueue

        fileprivate init(jobs: JobQueue) { self.jobs = jobs }

        func enqueue(_ job: consuming ExecutorJob) {
            jobs.append(.onThread(UnownedJob(job), asUnownedTaskExecutor()))
        }
    }
}

/// The queue of the store's thread and the loop that runs it.
private final class JobQueue: @unchecked Sendable {
    // @unchecked: `queue`, `stopping` and `timer` are only touched while `condition` is locked.
    enum Work {
        /// A job isolated to the store (its actor).
        case isolated(UnownedJob, UnownedSerialExecutor)
        /// A job of a task that prefers the store's thread, run there but isolated to nothing.
        case onThread(UnownedJob, UnownedTaskExecutor)
        case block(() -> Void)
    }

    private let condition = ThreadCondition()
    private var queue: [Work] = []
    private var stopping = false
    private var timer: (deadline: ContinuousClock.Instant, work: () -> Void)?

    func append(_ work: Work) {
        condition.lock()
        queue.append(work)
        condition.signal()
        condition.unlock()
    }

    func setTimer(at deadline: ContinuousClock.Instant, _ work: @escaping () -> Void) {
        condition.lock()
        timer = (deadline, work)
        condition.signal()
        condition.unlock()
    }

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

    func loop() {
        var batch: [Work] = []
        while true {
            condition.lock()
            if queue.isEmpty && !stopping {
                let deadline = ContinuousClock.now.advanced(by: Self.spin)
                while queue.isEmpty && !stopping && ContinuousClock.now < deadline {
                    condition.unlock()
                    sched_yield()
                    condition.lock()
                }
            }
            // A due timer runs before the queued work, whether or not work is queued: on a
            // busy thread it would otherwise wait for the queue to empty.
            var due: (() -> Void)?
            while true {
                let now = timer == nil ? nil : ContinuousClock.now
                if let timer, let now, timer.deadline <= now {
                    due = timer.work
                    self.timer = nil
                    break
                }
                guard queue.isEmpty && !stopping else { break }
                if let timer, let now {
                    condition.wait(for: now.duration(to: timer.deadline))
                } else {
                    condition.wait()
                }
            }
            if queue.isEmpty && due == nil {
                // Stopped: a timer not yet due ends with the thread. Kept, its work (which
                // holds this queue through the flow executor) and the queue would hold each
                // other for the life of the process. Released once the lock is let go.
                let dropped = timer
                timer = nil
                condition.unlock()
                withExtendedLifetime(dropped) {}
                return
            }
            swap(&batch, &queue)
            condition.unlock()
            due?()
            for work in batch {
                switch work {
                case .isolated(let job, let executor): job.runSynchronously(on: executor)
                case .onThread(let job, let executor): job.runSynchronously(on: executor)
                case .block(let block): block()
                }
            }
            batch.removeAll(keepingCapacity: true)
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
        // Timed waits count on the monotonic clock, which the wall clock's changes do not move.
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(variable, &attributes)
        pthread_condattr_destroy(&attributes)
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

    /// Waits, with the lock held, until signalled or `duration` has passed (or spuriously woken).
    func wait(for duration: Duration) {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let (seconds, attoseconds) = duration.components
        var nanoseconds = Int(deadline.tv_nsec) + Int(attoseconds / 1_000_000_000)
        var wholeSeconds = Int(deadline.tv_sec) + Int(clamping: min(seconds, 1 << 31))
        if nanoseconds >= 1_000_000_000 {
            nanoseconds -= 1_000_000_000
            wholeSeconds += 1
        }
        deadline.tv_sec = wholeSeconds
        deadline.tv_nsec = nanoseconds
        pthread_cond_timedwait(variable, mutex, &deadline)
    }
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
