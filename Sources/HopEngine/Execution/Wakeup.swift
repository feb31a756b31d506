import Synchronization

/// A wait until a deadline that another task can end early (``wake()``). A wake that comes
/// while nobody waits is kept: the next wait returns at once. A wait clears the wakes that came
/// before it returned, so that what its caller does next must cover them.
final class Wakeup: Sendable {
    private struct State {
        var woken = false
        /// The sleep of the wait under way, which a wake cancels.
        var sleep: Task<Void, any Error>?
    }

    private let state = Mutex(State())

    /// Ends the wait under way, or else the next one at once.
    func wake() {
        let sleep = state.withLock { state in
            state.woken = true
            return state.sleep
        }
        sleep?.cancel()
    }

    /// Returns at `deadline`, or once woken (since the last wait returned). Throws
    /// `CancellationError` when the calling task is cancelled.
    func wait(until deadline: ContinuousClock.Instant) async throws {
        let sleep = Task { try await Task.sleep(until: deadline, clock: .continuous) }
        let woken = state.withLock { state in
            if !state.woken { state.sleep = sleep }
            return state.woken
        }
        if !woken {
            await withTaskCancellationHandler {
                _ = await sleep.result
            } onCancel: {
                sleep.cancel()
            }
        }
        sleep.cancel()
        state.withLock { state in
            state.woken = false
            state.sleep = nil
        }
        try Task.checkCancellation()
    }
}
