import Foundation
import Logging
import ServiceLifecycle

extension HopEngine: Service {
    /// Runs the engine until the task is cancelled or a graceful shutdown begins.
    ///
    /// It resumes the unfinished runs it finds, reports ``EngineEvent/ready``, then watches:
    /// every ``Configuration/pollInterval`` it ends steps whose deadline passed, removes sessions
    /// whose expiry came (re-routing steps that lasted while a session was stored) and, when
    /// another process changed the database (`PRAGMA data_version`), executes the runs that
    /// change woke (an unhop, a login, a re-route, a restart) and stops the runs it cancelled.
    /// It renews the leases of the runs it executes three times per ``Configuration/leaseDuration``,
    /// takes over the runs of engines whose process is gone (their liveness lock is free) within
    /// ``Configuration/deadEngineCheckInterval``, and the runs of any other engine once their
    /// lease expired. A run it finds taken over by another engine (this one was stalled past its
    /// lease) stops here without another write.
    ///
    /// On shutdown (``stopExecuting()``), the steps in flight are cancelled and no other run
    /// starts; the leases of those runs and of the runs waiting for a place are released, and
    /// they all stay resumable.
    ///
    /// A failure of the database while it watches is logged and the next poll tries again; a
    /// run whose execution the failure stopped is resumed at that poll. One failure ends the
    /// engine instead: the database file removed, or another put in its place, while the engine
    /// had it open (`.replaced`; an operator restoring a backup without stopping the daemon).
    /// What it wrote from then on would go to a file no other process sees: it writes nothing
    /// more (every commit checks), stops its runs and throws the error within a poll, so that
    /// the process exits and, started again, opens the file now at the path. The same when a
    /// newer Hop upgraded the schema under it (`.schemaTooNew`, looked at every third of a
    /// lease): its runs are left for the newer release. At start-up (the first
    /// look for expired sessions and runs to resume), a failure that may pass (a busy lock, an
    /// I/O error, a lost connection to PostgreSQL) is logged and tried again, after 0.1 s, then
    /// twice as long each time up to 5 s, until it succeeds or the engine is shut down; one
    /// that cannot pass without an operator (no database, a damaged file, a schema this binary
    /// does not have) is thrown. ``EngineEvent/ready`` comes once the start-up succeeded.
    /// An outage, at start-up or later, is reported to the observer once as it begins
    /// (``EngineEvent/databaseFailing(_:)``) and once as it ends (``EngineEvent/databaseAnswers``),
    /// and the `hop_database_up` gauge reads 0 while it lasts.
    public func run() async throws {
        // Settings that can never work are refused before the database is read, which may take a
        // while (a resume of many runs): an operator sees at once why nothing is pruned.
        let retention = checkedRetention()
        let health: DatabaseHealth
        do {
            health = try await cancelWhenGracefulShutdown { try await self.startUp() }
        } catch is CancellationError {
            await stopExecuting()
            logger.info("engine stopped before it was running; unfinished runs stay resumable")
            return
        } catch {
            await stopExecuting()  // the runs it resumed before the failure go back at once
            throw error
        }
        environment.notify(.ready)
        logger.info(
            "engine running",
            metadata: [
                "hop.db": "\(storage.location)", "hop.engine": "\(id)",
                "hop.flows":
                    "\(environment.flowVersions.sorted { $0.key < $1.key }.map { "\($0.key)@\($0.value.joined(separator: "+"))" }.joined(separator: ","))",
            ])
        let ended = await cancelWhenGracefulShutdown {
            await withTaskGroup(of: HopError?.self) { group -> HopError? in
                if let retention {
                    group.addTask {
                        await self.retain(retention)
                        return nil
                    }
                }
                group.addTask { await self.watch(health) }
                group.addTask {
                    await self.renewLeases()
                    return nil
                }
                if self.configuration.lapsedLeases == .stopExecuting {
                    group.addTask {
                        await self.stopRunsWhoseLeasesLapse()
                        return nil
                    }
                }
                // Only the watch ends by itself, and only when the engine cannot go on.
                for await case let error? in group {
                    group.cancelAll()
                    return error
                }
                return nil
            }
        }
        await stopExecuting()
        // A replaced file refuses every commit: nothing to try.
        if ended?.code != .replaced {
            do {
                try await storage.makeDurable()
            } catch {
                logger.error("the last records could not be committed", metadata: ["hop.error": "\(error)"])
            }
        }
        if let ended {
            logger.critical(
                "engine stopped: its database cannot be used any more; start the process again",
                metadata: ["hop.error": "\(ended)"])
            throw ended
        }
        logger.info("engine stopped; unfinished runs stay resumable")
    }

    /// Ends the steps of sessions that expired while no daemon ran and resumes the unfinished
    /// runs, trying again while the database fails in a way that may pass. Returns what the
    /// observer was told of the database (one outage, whatever the number of tries).
    private func startUp() async throws -> DatabaseHealth {
        var delay = Self.firstStartUpRetry
        var health = DatabaseHealth()
        while true {
            do {
                try await expireSessions()
                try await resumeAll()
                health.answered(environment)
                return health
            } catch let error as HopError where error.mayPass {
                // A shutdown under way: not a failure to report (PostgreSQL's client refuses a
                // query of a cancelled task).
                try Task.checkCancellation()
                health.failed(error, environment)
                logger.error(
                    "cannot start: the database failed; trying again",
                    metadata: ["hop.error": "\(error)", "hop.retry.in": "\(delay)"])
                try await Task.sleep(for: delay)
                delay = min(delay * 2, Self.longestStartUpRetry)
            }
        }
    }

    /// The waits between two tries of a start-up that the database failed.
    static let firstStartUpRetry = Duration.milliseconds(100)
    static let longestStartUpRetry = Duration.seconds(5)
    /// What the watch and the lease renewals say while they fail (see ``RepeatedFailures``).
    static let watchLines = RepeatedFailures.Lines(
        first: "cannot check the database for changes; trying again at each poll",
        still: "the database still fails", over: "the database answers again")
    static let renewalLines = RepeatedFailures.Lines(
        first: "cannot renew the leases of the runs this engine executes; trying again at each renewal",
        still: "the leases still cannot be renewed",
        over: "the leases of the runs this engine executes are renewed again")

    /// `health`: what the observer was last told of the database. Returns the error that ends
    /// the engine: the database file was removed or replaced (`.replaced`), and whatever the
    /// engine wrote from then on would be lost to every other process; or a newer Hop upgraded
    /// the schema (`.schemaTooNew`, looked at every third of a lease), and this engine's code
    /// must not go on writing it. `nil` once cancelled.
    private func watch(_ health: DatabaseHealth) async -> HopError? {
        var health = health
        var seen = (try? await storage.changeVersion()) ?? 0
        // As often as leases are renewed, the watch looks for runs taken over from this engine
        // and for runs whose lease expired, whether or not the database changed.
        let lookEvery = configuration.leaseDuration / 3
        var lastLook = ContinuousClock.now
        // The start-up has just looked for engines that are gone (`resumeAll`).
        var lastDeadCheck = ContinuousClock.now
        var failures = RepeatedFailures()
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: configuration.pollInterval)
                try await timeOutDueSteps()
                try await expireSessions()
                let version = try await storage.changeVersion()
                let look = ContinuousClock.now - lastLook >= lookEvery
                if look {
                    lastLook = ContinuousClock.now
                    try await storage.checkSchema()
                }
                var released = 0
                if ContinuousClock.now - lastDeadCheck >= configuration.deadEngineCheckInterval {
                    lastDeadCheck = .now
                    released = try await environment.releaseRunsOfDeadEngines()
                }
                // Cleared by the look itself (resumeClaimable), so that a look skipped because
                // another is under way is not lost.
                let letGo = environment.holdings.withLock { $0.letGoAfterAFailure }
                if version != seen || look || released > 0 || letGo {
                    seen = version
                    try await stopRunsFinishedElsewhere()
                    try await resumeClaimable()
                }
                failures.logSuccess(to: logger, Self.watchLines)
                health.answered(environment)
            } catch is CancellationError {
                return nil
            } catch  where Task.isCancelled {
                return nil  // a call the engine's stop cancelled (PostgreSQL's client says so its own way)
            } catch let error as HopError where error.code == .replaced || error.code == .schemaTooNew {
                return error
            } catch {
                failures.log(error, to: logger, Self.watchLines)
                health.failed(error, environment)
                // What failed may have left a run to resume (a timed-out step's run not read
                // back, a batch let go): look at the next poll, not a third of a lease later.
                lastLook = .now - lookEvery
            }
        }
        return nil
    }

    /// Renews the leases of the runs this engine executes, three times per lease, until
    /// cancelled. A loop of its own, not a step of the watch's: a chore of the watch that waits
    /// (on PostgreSQL, for a row another client's transaction holds) or fails must not let the
    /// leases run out, or another engine would take over runs this one still executes.
    /// While they fail, said as the watch's polls are (``RepeatedFailures``): an outage logged
    /// at every renewal wrote a line every third of a lease for as long as it lasted.
    ///
    /// A renewal that failed is tried again after ``renewalRetry`` (or a third of a lease, when
    /// shorter): once the database answers again after an outage longer than a lease, when every
    /// lease of the fleet has expired, the engine renews its leases at the first chance, before
    /// another engine takes its runs as expired. Before, the next try came a third of a lease
    /// later (20 s with a lease of a minute).
    ///
    /// Both waits count from when the last renewal was asked for, not from its answer: a renewal
    /// that waited (for SQLite's write lock another process held, or a row another client locked)
    /// renewed the leases to a lease after it was asked for, which may be over by its answer, and
    /// the next one goes at once. Before, it went a third of a lease after the answer: a daemon
    /// that waited for a lock held past its lease kept its runs only by its heartbeat meanwhile,
    /// and once that heartbeat went stale, with `.stopExecuting`, it stopped their steps and ran
    /// them again (and any other engine could take them over).
    ///
    /// A run claimed while a renewal waited (the claim waited too) is held once the claim is
    /// answered, often after that renewal read the runs to renew, and its lease counts from when
    /// the claim was asked for. When that renewal was asked for more than a third of a lease
    /// after the claim, the next one goes at once (``ExecutionEnvironment/hold(_:leasedAt:)``):
    /// before, it went a third of a lease later, and a claim that waited longer than its lease
    /// less that third had its step stopped, with `.stopExecuting`, once the engine's heartbeat no
    /// longer shielded it.
    private func renewLeases() async {
        var failures = RepeatedFailures()
        let interval = configuration.leaseDuration / 3
        var next = ContinuousClock.now + interval
        while !Task.isCancelled {
            var asked = next
            do {
                // Woken early by a claim answered after a renewal that left its run out.
                try await environment.renewalWakeup.wait(until: next)
                // Asked for now: each lease renewed ends no sooner than a lease from now.
                asked = ContinuousClock.now
                let runIDs = environment.holdings.withLock { $0.renewing(at: asked) }
                let renewed = try await storage.renewLeases(owner: id, runIDs: runIDs, until: environment.leaseEnd)
                // Only a loop that stops runs whose leases lapse reads when they were renewed.
                if configuration.lapsedLeases == .stopExecuting {
                    environment.holdings.withLock { $0.renewed(renewed, at: asked) }
                }
                failures.logSuccess(to: logger, Self.renewalLines)
                next = asked + interval
            } catch is CancellationError {
                return
            } catch  where Task.isCancelled {
                return  // a call the engine's stop cancelled (PostgreSQL's client says so its own way)
            } catch {
                failures.log(error, to: logger, Self.renewalLines)
                next = asked + min(interval, Self.renewalRetry)
            }
        }
    }

    /// How soon a lease renewal that failed is tried again.
    static let renewalRetry = Duration.milliseconds(500)

    /// With ``LapsedLeases/stopExecuting``: stops executing each run whose lease was neither
    /// taken nor renewed in the last ``lapsedAfter`` (its renewals failed, or wait unanswered),
    /// until cancelled. From the lease's end on, another engine may take the run over: its
    /// step must not be running here any more. Once stopped, the run is executed again from its
    /// history, claimed first: the claim waits for the database, and one that another engine
    /// took over meanwhile is left to it. Waits for the next lease due to lapse, or a third of
    /// a lease, whichever comes first; a lease renewed meanwhile is looked at again then.
    private func stopRunsWhoseLeasesLapse() async {
        let kept = Self.lapsedAfter(configuration.leaseDuration)
        let longestWait = configuration.leaseDuration / 3
        while !Task.isCancelled {
            let now = ContinuousClock.now
            // On a file, while this engine's heartbeat says it waits for the write lock another
            // process holds, no other engine takes its runs (`LivenessLocks`): a lease that
            // lapses meanwhile is not stopped, until a second before the heartbeat could go stale.
            let shielded = environment.incarnation.heartbeatHolds(lessMargin: .seconds(1)).flatMap {
                $0 > now ? $0 : nil
            }
            let lapsed = shielded != nil ? [] : environment.holdings.withLock { $0.lapse(before: now - kept) }
            if !lapsed.isEmpty {
                environment.metrics.runsLapsed.increment(by: lapsed.count)
                for runID in lapsed {
                    guard let execution = executing[runID] else { continue }
                    executeAgain.insert(runID)  // once settled, claimed again (`didSettle`)
                    execution.cancel()
                }
                logger.warning(
                    "could not renew the leases of runs before they ended (the database did not answer); stopped executing them, writing nothing more: another engine may take them over; each is executed again from its history if this engine can claim it again",
                    metadata: [
                        "hop.runs": "\(lapsed.count)",
                        "hop.run": "\(lapsed.sorted().prefix(20).map(String.init).joined(separator: ","))",
                    ])
            }
            let next =
                shielded ?? environment.holdings.withLock { $0.oldestLease }.map { $0 + kept } ?? now + longestWait
            do {
                try await Task.sleep(until: min(next, now + longestWait), clock: .continuous)
            } catch {
                return
            }
        }
    }

    /// How long after it was asked for an engine takes a lease as kept: the lease less a tenth
    /// of it, at most a second (the lease in the database ends no sooner than the whole of it),
    /// so that a run is stopped here before another engine can find its lease expired.
    static func lapsedAfter(_ lease: Duration) -> Duration {
        lease - min(lease / 10, .seconds(1))
    }

    /// The configured retention, or `nil` when there is none or its settings can never work
    /// (said once, at the error level).
    private func checkedRetention() -> Retention? {
        guard let retention = configuration.retention else { return nil }
        do {
            try retention.validate()
            return retention
        } catch {
            logger.error("retention is off: its settings are refused", metadata: ["hop.error": "\(error)"])
            return nil
        }
    }

    /// Prunes finished runs every `retention.interval` until cancelled.
    private func retain(_ retention: Retention) async {
        while !Task.isCancelled {
            do {
                let pruning = Pruning(
                    finishedBefore: storage.now().addingTimeInterval(-retention.finishedAfter.timeInterval),
                    flow: retention.flow,
                    keepLast: retention.keepLast)
                let report = try await storage.prune(pruning, dryRun: false)
                if report.runs > 0 {
                    logger.info(
                        "pruned finished runs",
                        metadata: [
                            "hop.pruned.runs": "\(report.runs)", "hop.pruned.entries": "\(report.historyEntries)",
                            "hop.pruned.bytes": "\(report.reclaimedBytes)",
                        ])
                }
            } catch is CancellationError {
                return
            } catch let error as HopError where error.code == .invalidInput {
                // A setting that can never work (a flow name that is no name): said once, not every interval.
                logger.error("retention is off: its settings are refused", metadata: ["hop.error": "\(error)"])
                return
            } catch {
                logger.error("cannot prune finished runs", metadata: ["hop.error": "\(error)"])
            }
            do {
                try await Task.sleep(for: max(retention.interval, Retention.shortestInterval))
            } catch {
                return
            }
        }
    }

    /// Ends the parked steps whose deadline passed, exactly once each, and moves their runs on.
    private func timeOutDueSteps() async throws {
        for run in try await storage.dueTimeouts(now: storage.now())
        where environment.flow(named: run.flow, version: run.flowVersion) != nil {
            guard let token = run.currentToken else { continue }
            do {
                let entry = try await storage.recordTimeout(runID: run.id, token: token, owner: nil)
                environment.notify(.recorded(run: environment.ref(run), event: entry))
                logger.info("step timed out", metadata: environment.metadata(run, step: run.currentStep))
            } catch let error as HopError where error.code == .refused {
                continue  // unhopped, or timed out by another engine, in the meantime
            }
            if let updated = try await storage.run(id: run.id) { execute(updated) }
        }
    }

    /// Removes the sessions whose expiry has come and moves on the runs whose step lasted only
    /// while a session was stored (re-routed, as by a logout).
    private func expireSessions() async throws {
        for runID in try await storage.expireSessions(now: storage.now()) {
            if let run = try await storage.run(id: runID) {
                logger.info(
                    "session expired; its step is re-routed", metadata: environment.metadata(run, step: run.currentStep)
                )
                execute(run)
            }
        }
    }

    /// Cancels the tasks of runs that another process cancelled or restarted, and of runs this
    /// engine held but lost to another (it was frozen past its lease): those write nothing more.
    private func stopRunsFinishedElsewhere() async throws {
        guard !executing.isEmpty else { return }
        for (runID, stored) in try await storage.statuses(of: Array(executing.keys)) {
            if !stored.status.isUnfinished {
                executing[runID]?.cancel()
                logger.info(
                    "run was ended by another process; its step is cancelled",
                    metadata: ["hop.run": "\(runID)", "hop.status": "\(stored.status.rawValue)"])
            } else if stored.owner != id, environment.holdings.withLock({ $0.lose(runID) }) {
                environment.metrics.runsTakenOver.increment()
                executing[runID]?.cancel()
                logger.warning(
                    "lost the lease on a run to another engine (this one was stalled past its lease); stopped executing it, writing nothing more",
                    metadata: [
                        "hop.run": "\(runID)", "hop.owner": "\(stored.owner.map(Incarnation.label(of:)) ?? "none")",
                    ])
            }
        }
    }
}
