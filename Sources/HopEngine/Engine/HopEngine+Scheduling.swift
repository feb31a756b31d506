/// The task of each run this engine executes: at most one per run, and at most
/// ``HopEngine/Configuration/maxConcurrentRuns`` in all; a run asked to execute while it
/// executes does so again once the current execution settles, and one asked while every place
/// is taken waits its turn.
extension HopEngine {
    /// Executes `run` in a task of its own, unless this engine is executing it already
    /// (then it executes once more as soon as the current execution settles), or every place
    /// is taken (then it waits, and executes when a place frees, oldest first).
    ///
    /// - Parameter claimed: the run's history, when this engine has already claimed the run
    ///   and read it (a resume of many runs does both in bulk, for free places only).
    func execute(_ run: RunRecord, claimed: Claim? = nil) {
        guard !stopping else {
            lettingGo.append(run.id)  // it stays in the database as it is, for the next engine
            return
        }
        guard executing[run.id] == nil else {
            executeAgain.insert(run.id)
            return
        }
        guard executing.count < configuration.maxConcurrentRuns, waiting.isEmpty else {
            // It claims the run when its turn comes: a lease held while it waits could lapse.
            waiting.append(run)
            return
        }
        launch(run, claimed: claimed)
    }

    /// Starts the task that executes `run`.
    private func launch(_ run: RunRecord, claimed: Claim?) {
        guard let definition = environment.flow(named: run.flow, version: run.flowVersion) else {
            // Left alone, not failed: an engine that has its version carries it on.
            logger.info(
                "run is on a flow version this engine does not have; left for an engine that has it",
                metadata: environment.metadata(run).merging(["hop.version": "\(run.flowVersion)"]) { $1 })
            return
        }
        // Few runs at once: the body on the store's thread, where its records need no thread
        // hand-off (a lone flow waits on each of them). Many: on the pool, so that the store's
        // thread does the database's work only, which is then what bounds them; the bodies'
        // own work runs beside it on the other cores.
        let bodyExecutor = executing.count < Self.bodiesBesideTheStoreBelow ? environment.storage.flowExecutor : nil
        let executor = RunExecutor(
            run: run, definition: definition, environment: environment, claimed: claimed, bodyExecutor: bodyExecutor)
        executing[run.id] = Task(executorPreference: bodyExecutor) { [self, environment] in
            let settlement = await executor.execute()
            @Sendable func settle() async {
                // The run as it ended, read where the execution ran (beside the store, for a body
                // on the store's thread) when the engine will want it: no store call on its way back.
                let stored = environment.wantsSettledRun(run.id) ? try? await environment.storage.run(id: run.id) : nil
                await self.didSettle(run.id, settlement, stored: stored)
            }
            if Task.isCancelled {
                // Stopped (the engine stops, or the run ended elsewhere): the run is read in a
                // task of its own, as PostgreSQL's client refuses to start a query for a
                // cancelled task (the observer and the run's waiters were not told how it ended),
                // and waited for a moment at most: a database that does not answer must not
                // hold the stop. Unread, the observer is not told, and waiters read it themselves.
                // A run the engine let go is read once its release ended, so that the observer
                // never sees it still held; that wait counts in the moment too.
                let stored =
                    environment.wantsSettledRun(run.id)
                    ? await waitAtMost(ExecutionEnvironment.longestStopWait) {
                        if case .stopped(let release) = settlement { await release.value }
                        return try? await environment.storage.run(id: run.id)
                    } ?? nil : nil
                await self.didSettle(run.id, settlement, stored: stored, cancelled: true)
            } else {
                await settle()
            }
        }
    }

    /// Executes the runs `runIDs` (woken by a change this engine made), as stored now. The
    /// change is made: a run that cannot be read now (the database failed) is left to the
    /// watch, which looks for runs to resume at its next poll.
    func execute(runIDs: [Int64]) async {
        for runID in runIDs {
            do {
                if let run = try await storage.run(id: runID) { execute(run) }
            } catch {
                logger.error(
                    "cannot read a run this engine's change woke; the watch resumes it",
                    metadata: ["hop.run": "\(runID)", "hop.error": "\(error)"])
                environment.holdings.withLock { $0.letGoAfterAFailure = true }
            }
        }
    }

    /// - Parameters:
    ///   - stored: the run as its execution ended, when the execution read it.
    ///   - cancelled: whether the execution was cancelled. Then, while the engine stops, the run
    ///     is not read here: what the execution read within a moment is all (a stop does not
    ///     wait for the database).
    private func didSettle(
        _ runID: Int64, _ settlement: RunExecutor.Settlement, stored: RunRecord?, cancelled: Bool = false
    ) async {
        let read = !(cancelled && stopping)
        if read, case .again = settlement, let run = try? await storage.run(id: runID), run.status == .running {
            executeAgain.insert(runID)  // its step was ended elsewhere as it parked, or as it returned
        }
        executing[runID] = nil
        environment.holdings.withLock { $0.settled(runID) }
        if executeAgain.remove(runID) != nil, !stopping, let run = try? await storage.run(id: runID),
            run.status == .running, executing[runID] == nil, !stopping
        {
            execute(run)  // in the place it just left, unless runs wait for one
            executeWaiting()
            return
        }
        let waiters = settleWaiters.removeValue(forKey: runID) ?? []
        if !waiters.isEmpty { environment.holdings.withLock { _ = $0.awaited.remove(runID) } }
        // Read once, for the observer and for whoever waits for the run to settle.
        var settled: RunRecord?
        if environment.configuration.observer != nil || !waiters.isEmpty {
            settled = stored
            if settled == nil, read { settled = try? await storage.run(id: runID) }
        }
        if let settled { environment.notify(.settled(run: settled)) }
        for waiter in waiters { waiter.resume(returning: settled) }
        executeWaiting()
    }

    /// Executes waiting runs in the free places, oldest first; with none waiting and places
    /// free, claims more of the runs a resume left in the database.
    func executeWaiting() {
        guard !stopping else { return }  // the places a stop frees stay free
        let limit = configuration.maxConcurrentRuns
        while executing.count < limit, let next = waiting.next() {
            if executing[next.id] == nil { launch(next, claimed: nil) } else { executeAgain.insert(next.id) }
        }
        let free = limit - executing.count
        if claimableLeft, !resuming, waiting.isEmpty, free >= min(Self.resumeBatch, max(1, limit / 2)) {
            claimableLeft = false
            Task { _ = try? await self.resumeClaimable() }
        }
    }

    /// Cancels every run this engine executes and waits until they have stopped.
    ///
    /// No run starts executing meanwhile: a place a stopped run frees is not given to a run
    /// waiting for one, and a run asked to execute (a start, an unhop) is left as it is stored.
    /// Runs that waited for a place are let go, their leases released (a run this engine
    /// started holds one from its start): like the stopped ones, they stay resumable, by this
    /// engine's next ``run()`` or another engine, at once. A database that does not answer
    /// (a PostgreSQL server away) does not hold the stop: each release, and each read of a
    /// stopped run for the observer, is waited for 2 s at most; the runs not released then are
    /// taken over once this process is gone or their leases expire. A stopped run is read for
    /// the observer once its release ended (within that read's 2 s), so that the observer never
    /// sees it still held; one not read then is not told.
    public func stopExecuting() async {
        stopping = true
        stops += 1
        defer { stopping = false }
        while let run = waiting.next() {
            lettingGo.append(run.id)
            for waiter in settleWaiters.removeValue(forKey: run.id) ?? [] {
                waiter.resume(returning: nil)  // ``settled(runID:)`` reads the run itself
            }
            environment.holdings.withLock { _ = $0.awaited.remove(run.id) }
        }
        while !executing.isEmpty {
            let tasks = Array(executing.values)
            for task in tasks { task.cancel() }
            for task in tasks { await task.value }
        }
        // Those that waited, and those asked to execute meanwhile (a start, a resume's claim).
        while !lettingGo.isEmpty {
            let letGo = lettingGo
            lettingGo = []
            await environment.releaseAsStopping(letGo, what: "the runs that waited for a place")
        }
    }
}
