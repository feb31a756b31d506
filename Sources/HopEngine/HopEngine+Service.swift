import HopStore
import Logging
import ServiceLifecycle

extension HopEngine: Service {
    /// Runs the engine until the task is cancelled or a graceful shutdown begins: resumes
    /// unfinished runs, then watches the database for changes made by other processes
    /// (an unhop by `hopctl`, a stored session, a restarted run) and executes the runs they wake.
    ///
    /// On shutdown, the steps in flight are cancelled and their runs stay resumable.
    public func run() async throws {
        try await resumeAll()
        logger.info("engine running", metadata: ["hop.db": "\(store.path)", "hop.flows": "\(flowNames.joined(separator: ","))"])
        await cancelWhenGracefulShutdown {
            await self.watch()
        }
        await stopExecuting()
        logger.info("engine stopped; unfinished runs stay resumable")
    }

    private func watch() async {
        var seen = (try? await store.dataVersion()) ?? 0
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: configuration.pollInterval)
                let version = try await store.dataVersion()
                if version != seen {
                    seen = version
                    try await resumeAll()
                }
            } catch is CancellationError {
                return
            } catch {
                logger.error("cannot check the database for changes", metadata: ["hop.error": "\(error)"])
            }
        }
    }

    /// Cancels every run this engine executes and waits until they have stopped.
    public func stopExecuting() async {
        let tasks = Array(executing.values)
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }
}
