#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The rules every backend applies the same way, with the same words: what a write refuses and
/// why. A backend reads the state in its own dialect and asks these; so a refusal reads the same
/// on a file as on a server.
package struct StorageRules: Sendable {
    /// Where the data lives, for the errors (a file path, or a URL without its password).
    package let location: String

    package init(location: String) { self.location = location }

    private func refuse(_ code: HopError.Code, _ operation: String, _ reason: String, hint: String? = nil) -> HopError {
        HopError(code, operation: operation, path: location, reason: reason, hint: hint)
    }

    /// Refuses to copy a deployment into a database that already holds something: `counts` are
    /// its runs, first-use flags, sessions and facts.
    package func checkEmptyTarget(counts: [Int64], operation: String) throws {
        guard counts.contains(where: { $0 > 0 }) else { return }
        let names = ["runs", "first-use flags", "sessions", "facts"]
        let held = zip(counts, names).filter { $0.0 > 0 }.map { "\($0.0) \($0.1)" }
        throw refuse(
            .refused, operation, "the target database is not empty: it holds \(held.joined(separator: ", "))",
            hint: "Copy into a new, empty database (nothing was changed); never over a deployment's data")
    }

    /// Checks a session before it is stored: a token of 1 to 4096 bytes, an expiry still to come
    /// (by `now`, the storage's clock).
    package func checkSession(token: String, expiresAt: Date?, now: Date) throws {
        guard !token.isEmpty, token.utf8.count <= StoredSession.maximumTokenBytes else {
            throw refuse(
                .invalidInput, "store session",
                "the session token must be 1 to \(StoredSession.maximumTokenBytes) bytes")
        }
        if let expiresAt, expiresAt <= now {
            throw refuse(
                .invalidInput, "store session", "the session's expiry has passed already; nothing was changed",
                hint: "Give an expiry in the future, or none")
        }
    }

    /// Checks that run `runID`, which a cancel or a restart names so that a retried command
    /// changes nothing, is still the run it acts on: `current`, the subject's unfinished run of
    /// the flow (a cancel) or its latest run (a restart). `named` is run `runID` as stored.
    package func checkNamedRun(
        _ runID: Int64, named: RunRecord?, current: RunRecord?, flow: String, subject: String, verb: String,
        operation: String
    ) throws {
        guard let named, named.flow == flow, named.subject == subject else {
            throw refuse(
                .notFound, operation,
                "run \(runID) is not a run of flow '\(flow)' for subject '\(subject)'; nothing was changed",
                hint: "Check the run id with `hopctl status --flow \(flow) --subject \(subject)`")
        }
        guard let current, current.id == runID else {
            let state = named.status.isUnfinished ? "not the subject's latest run" : "already \(named.status.rawValue)"
            let after = current.map { " and run \($0.id) (\($0.status.rawValue)) came after it" } ?? ""
            throw refuse(
                .refused, operation,
                "run \(runID) is \(state)\(after); nothing was changed (a retried command changes nothing)",
                hint: current.map { "To \(verb) run \($0.id), name it: --run \($0.id)" }
                    ?? "Check `hopctl status --flow \(flow) --subject \(subject)`")
        }
    }

    /// Refuses an entry number without its run: entries are numbered in each run, so the same
    /// number names a step of the next run too.
    package func checkEntryNamesItsRun(entry: Int64?, runID: Int64?, operation: String) throws {
        guard entry != nil, runID == nil else { return }
        throw refuse(
            .invalidInput, operation, "a history entry names a step only with its run; nothing was changed",
            hint: "Give the run id with the entry (see `hopctl status`)")
    }

    /// Checks that history entry `entry` of `run`, which an unhop names so that a retried command
    /// changes nothing, is the hop that parked the run on `step`, and that this parking has not
    /// ended. `hop` is that entry as stored (its step, kind and token); `ending`, how the step it
    /// entered ended, when it is not the step in flight; `current`, the entry of the step in flight.
    package func checkNamedEntry(
        _ entry: Int64, of run: RunRecord, step: String, hop: (step: String?, kind: String, token: String?)?,
        ending: String?, current: Int64?, operation: String
    ) throws {
        let (flow, subject) = (run.flow, run.subject)
        let look = "`hopctl status --flow \(flow) --subject \(subject)`"
        guard let hop, hop.kind == HistoryKind.hop.rawValue, hop.step == step, let token = hop.token else {
            throw refuse(
                .notFound, operation, "entry \(entry) of run \(run.id) is not a hop to '\(step)'; nothing was changed",
                hint: "The entry of the step the run is parked on is in \(look)")
        }
        guard token != run.currentToken else { return }
        let how = ending.map { $0 == HistoryKind.unhop.rawValue ? "has already unhopped" : "has already ended (\($0))" }
        let now: String
        switch (run.status, run.currentStep) {
        case (.parked, let parked?): now = "is now parked on '\(parked)'\(current.map { " (entry \($0))" } ?? "")"
        case (_, let inFlight?): now = "is now executing its step '\(inFlight)' in the daemon"
        case (_, nil): now = "now has no step in flight"
        }
        throw refuse(
            .refused, operation,
            "step '\(step)' that entry \(entry) of run \(run.id) entered \(how ?? "has ended"); run \(run.id) \(now); "
                + "nothing was changed (a retried command changes nothing)",
            hint: run.status == .parked
                ? "To unhop the step the run is parked on now, name its entry (see \(look))" : "Check \(look)")
    }

    /// The token of the step of `run` that `hopctl unhop` may finish by hand, or why it may not:
    /// the run must be parked on `step`, and `step` must not be one a stored session finishes.
    package func tokenToUnhop(_ run: RunRecord, step: String, operation: String) throws -> String {
        let (flow, subject) = (run.flow, run.subject)
        guard run.status == .parked, run.currentStep == step, let token = run.currentToken else {
            let now: String
            switch (run.status, run.currentStep) {
            case (.parked, let parked?): now = "it is parked on '\(parked)'"
            case (_, let inFlight?): now = "its step '\(inFlight)' is executing in the daemon and unhops itself"
            case (_, nil): now = "it has no step in flight"
            }
            throw refuse(
                .refused, operation, "run \(run.id) is not parked on '\(step)': \(now); nothing was changed",
                hint: "Check `hopctl status --flow \(flow) --subject \(subject)`")
        }
        if run.wakeOn == .sessionStored {
            throw refuse(
                .refused, operation,
                "step '\(step)' of run \(run.id) finishes when a session is stored, not by hand; nothing was changed",
                hint: "Log the user in: `hopctl session login USER --subject \(subject)`")
        }
        return token
    }

    /// Checks that the history of run `runID` ends at entry `following`, the last one the writer
    /// (the engine executing the run) recorded or read; `last` is the entry it ends at. Refused
    /// otherwise: the history changed without the writer, and what it would write follows
    /// entries that are not there, or passes over ones it never saw.
    package func checkFollows(runID: Int64, last: Int64, following: Int64?, operation: String) throws {
        guard let following, following != last else { return }
        throw refuse(
            .refused, operation,
            "the history of run \(runID) ends at entry \(last), not at entry \(following), the last this engine recorded or read: it changed without this engine (a failover to a standby that lacked the last commits, a database restored, a write from outside)",
            hint: "Nothing to do: the engine executes the run again from the history the database holds")
    }

    /// Why an end of the step in flight of run `runID` with a token that is not its token is
    /// refused: `earlier` is how that token's step ended, if it did.
    package func staleToken(
        runID: Int64, currentStep: String?, currentToken: String?, earlier: (step: String, kind: String)?,
        operation: String
    ) -> HopError {
        if let earlier {
            let how = earlier.kind == "unhop" ? "has already unhopped" : "has already ended (\(earlier.kind))"
            return refuse(.refused, operation, "step '\(earlier.step)' of run \(runID) \(how); a hop ends once")
        }
        if currentToken == nil {
            return refuse(.refused, operation, "run \(runID) has no step in flight")
        }
        return refuse(
            .refused, operation,
            "the token is stale or unknown: it is not the token of step '\(currentStep ?? "?")' in flight",
            hint: "Read the current token again (`hopctl status`) and retry")
    }

    /// Checks that a fork of run `run` through entry `seq` may go ahead, from what its store read
    /// of the run's history at `seq` (``ForkPoint``), or says why it is refused: `seq` is no entry
    /// of the run, the run was forked through it before, or a step would be in flight at it.
    package func checkFork(of run: RunRecord, at point: ForkPoint, through seq: Int64, operation: String) throws {
        guard seq >= 1, seq <= point.lastSeq else {
            throw refuse(
                .refused, operation,
                "run \(run.id) has no entry \(seq) (its entries are 1 to \(point.lastSeq)); nothing was changed",
                hint:
                    "Choose an entry from `hopctl history --flow \(run.flow) --subject \(run.subject) --run \(run.id)`")
        }
        // A fork through the same entry again (a retried command): the run it made may have
        // finished, so no unfinished run refuses it; the entry that links the two does.
        for value in point.links {
            guard let link = value.flatMap({ try? JSONDecoder().decode(ForkLink.self, from: Data($0.utf8)) }),
                let to = link.to, link.through == seq
            else { continue }
            throw refuse(
                .refused, operation,
                "run \(run.id) was already forked through entry \(seq), into run \(to); nothing was changed "
                    + "(a retried command changes nothing)",
                hint: "See that run with `hopctl history --flow \(run.flow) --subject \(run.subject) --run \(to)`")
        }
        if let hop = point.lastHop, !point.lastHopEnded {
            throw refuse(
                .refused, operation,
                "at entry \(seq), step '\(hop.step ?? "?")' of run \(run.id) is in flight (its hop is entry \(hop.seq), its end is not taken); nothing was changed",
                hint: "Fork through entry \(hop.seq - 1) to enter '\(hop.step ?? "?")' again, or through its end")
        }
    }

    /// Why `hopctl start` is refused while `existing`, the subject's unfinished run of the flow, runs.
    package func alreadyUnfinished(_ existing: RunRecord, operation: String) -> HopError {
        let place = existing.currentStep.map { " at step '\($0)'" } ?? ""
        return refuse(
            .refused, operation,
            "run \(existing.id) of flow '\(existing.flow)' for subject '\(existing.subject)' is unfinished (\(existing.status.rawValue)\(place)); a subject has at most one unfinished run of a flow",
            hint: "Let it finish, or end it first with `hopctl cancel` (or start over with `hopctl restart`)")
    }

    /// Checks that the session stored for `subject` (`stored`, its user; `nil` without one) is
    /// `userID`'s, which a logout names so that a retried command never logs out the next user.
    package func checkSessionUser(_ userID: String, stored: String?, subject: String, operation: String) throws {
        guard let stored, stored != userID else { return }
        throw refuse(
            .refused, operation,
            "the session of subject '\(subject)' is not \(userID)'s; nothing was changed (a retried command changes nothing)",
            hint: "See whose it is with `hopctl session show --subject \(subject)`")
    }

    /// Checks that the first-use flag of `feature` (`stored`, when it was set, in milliseconds;
    /// `nil` without one) is the one set at `usedAt`, to the second, which a reset names so that
    /// a retried command never clears the flag a flow set again after the first.
    package func checkFlagUsedAt(
        _ usedAt: Date, stored: Int64?, feature: String, subject: String, operation: String
    ) throws {
        guard let stored else { return }
        let second = { (milliseconds: Int64) in milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000 }
        guard second(stored) != second(Clock.milliseconds(usedAt)) else { return }
        throw refuse(
            .refused, operation,
            "the first-use flag '\(feature)' of subject '\(subject)' was set at \(Self.iso8601(Clock.date(stored))), "
                + "not at \(Self.iso8601(usedAt)): it was used again since; nothing was changed (a retried command changes nothing)",
            hint: "See the flags with `hopctl first-use list --subject \(subject)`")
    }

    /// `date` to the second, as hopctl's JSON shows it (`2026-11-26T09:16:46Z`).
    private static func iso8601(_ date: Date) -> String {
        Date.ISO8601FormatStyle().format(date)
    }

    /// Checks that the subject's latest run of the flow is the one a start expects (`latest`,
    /// the run as stored), so that a retried start starts no second run.
    package func checkLatest(
        _ expected: ExpectedLatestRun, latest: RunRecord?, flow: String, subject: String, operation: String
    ) throws {
        let unchanged = "nothing was changed (a retried command starts no second run)"
        switch (expected, latest) {
        case (.noRun, nil): return
        case (.run(let id), let latest?) where latest.id == id: return
        case (.noRun, let latest?):
            throw refuse(
                .refused, operation,
                "the subject has run \(latest.id) (\(latest.status.rawValue)) of flow '\(flow)', not none; \(unchanged)",
                hint: "To start a run after it, name it: --latest \(latest.id)")
        case (.run(let id), nil):
            throw refuse(
                .refused, operation, "subject '\(subject)' has no run of flow '\(flow)', not run \(id); \(unchanged)",
                hint: "To start its first run, say so: --latest none")
        case (.run(let id), let latest?):
            throw refuse(
                .refused, operation,
                "run \(id) is not the latest run of flow '\(flow)' for subject '\(subject)': "
                    + (id < latest.id
                        ? "run \(latest.id) (\(latest.status.rawValue)) came after it"
                        : "the latest is run \(latest.id) (\(latest.status.rawValue))") + "; \(unchanged)",
                hint: "To start a run after that one, name it: --latest \(latest.id)")
        }
    }

    /// The flow version a new run of `flow` started from outside an engine takes: `version`, else
    /// `newest` (the version of the flow's newest run here); or why there is none to take, when no
    /// run of the flow has run here (`known` are the flows that have: read only then, see
    /// ``needsKnownFlows(newest:allowingNewFlow:)``) and it is not `allowingNewFlow`.
    package func versionForNewRun(
        flow: String, version: String?, newest: String?, allowingNewFlow: Bool, known: [String], operation: String
    ) throws -> String {
        if Self.needsKnownFlows(newest: newest, allowingNewFlow: allowingNewFlow) {
            let listed =
                known.isEmpty ? "no flow has run here yet" : "the flows that ran here: \(known.joined(separator: ", "))"
            throw refuse(
                .refused, operation, "no run of flow '\(flow)' has ever run here (\(listed))",
                hint:
                    "Check the flow's name; to start the first run of a flow a daemon has registered, pass --force and its --flow-version"
            )
        }
        guard let chosen = version ?? newest else {
            throw refuse(
                .refused, operation, "no run of flow '\(flow)' has run here to take the flow version from",
                hint: "Pass the flow version the daemon registered (--flow-version)")
        }
        return chosen
    }

    /// Whether ``versionForNewRun(flow:version:newest:allowingNewFlow:known:operation:)`` refuses,
    /// naming the flows that ran here.
    package static func needsKnownFlows(newest: String?, allowingNewFlow: Bool) -> Bool {
        newest == nil && !allowingNewFlow
    }

    /// Why a fork of run `old` is refused while `other`, another run of the subject, is unfinished.
    package func otherRunUnfinished(_ other: RunRecord, operation: String) -> HopError {
        refuse(
            .refused, operation, "run \(other.id) of the subject is unfinished; nothing was changed",
            hint: "Fork its latest run, or cancel run \(other.id) first")
    }

    /// Throws `.schemaTooNew` when `newest`, the database's latest applied migration now, is
    /// past `opened`, the schema version the storage opened it at: a newer Hop upgraded it since.
    package func checkNotUpgraded(newest: (version: Int, name: String)?, opened: Int) throws {
        guard let newest, newest.version > opened else { return }
        throw HopError(
            .schemaTooNew, operation: "check the schema", path: location,
            reason:
                "a newer Hop upgraded the database to schema version \(newest.version) (\(newest.name)) while this process ran; this binary knows versions up to \(opened)",
            hint:
                "Start the newer release in its place: this engine stopped, and its unfinished runs are left for it. Stop the daemons before `hopctl migrate` next time"
        )
    }

    /// Checks the migrations recorded as applied (version, name, checksum) against this binary's:
    /// refuses a schema newer than it knows, and an applied migration whose text changed.
    package func checkApplied(
        _ applied: [(version: Int, name: String, checksum: String)], against migrations: [Migration]
    )
        throws
    {
        let latest = migrations.last?.version ?? 0
        if let newest = applied.last, newest.version > latest {
            throw HopError(
                .schemaTooNew, operation: "open", path: location,
                reason:
                    "the database has schema version \(newest.version) (\(newest.name)), written by a newer Hop; this binary knows versions up to \(latest)",
                hint: "Use a Hop release that knows schema version \(newest.version); nothing was changed")
        }
        let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
        for record in applied {
            guard let migration = known[record.version], migration.checksum == record.checksum else {
                throw HopError(
                    .migrationEdited, operation: "open", path: location,
                    reason:
                        "migration \(record.version) (\(record.name)) was applied with checksum \(record.checksum), but this binary's copy differs",
                    hint:
                        "Applied migrations must never be edited: restore the original file and add a new numbered migration instead"
                )
            }
        }
    }
}

/// What a fork of a run through an entry is checked against (``StorageRules/checkFork(of:at:through:operation:)``),
/// read by a store from the run's history in a few small results: a fork never holds the history
/// it copies, which for a run of a million entries took more than 200 MiB.
package struct ForkPoint: Sendable {
    /// The number of the run's last entry (0 for none).
    package var lastSeq: Int64
    /// The values of the run's `fork` entries: where it was forked before, and through which entry.
    package var links: [String?]
    /// The run's last hop at or before the entry forked through, if any.
    package var lastHop: (seq: Int64, step: String?)?
    /// Whether an entry at or before the entry forked through ends that hop's step.
    package var lastHopEnded: Bool

    package init(lastSeq: Int64, links: [String?], lastHop: (seq: Int64, step: String?)?, lastHopEnded: Bool) {
        self.lastSeq = lastSeq
        self.links = links
        self.lastHop = lastHop
        self.lastHopEnded = lastHopEnded
    }
}

/// The value of a `fork` entry: the run it was forked into (`to`, on the old run) or from
/// (`from`, on the new one), and the entry of the old run it was forked through.
private struct ForkLink: Decodable {
    var to: Int64?
    var through: Int64
}
