#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The storage seam: every operation the engine needs of a database, and nothing else.
///
/// ``HopStore`` (one SQLite file) is the first implementation; a server database for fleets of
/// daemons is the next. No type of a particular database crosses this protocol: records
/// (``RunRecord``, ``HistoryEntry``, ``StoredSession``) and ``HopError`` go in and out.
///
/// What every implementation guarantees:
/// - each mutating operation is one transaction: when it returns, its change is durable —
///   or, for an operation asked for ``WriteDurability/coalesced``, applied and durable soon
///   after, in order with every other write; when it throws, nothing changed;
/// - writes to a run are fenced by `owner`: an operation given an owner is refused (`.refused`)
///   unless that incarnation holds the run, so an engine that lost a run writes nothing more;
/// - a hop ends once: of an unhop, a timeout and a re-route of the same hop, the first to commit
///   wins and the others are refused;
/// - ``changeVersion()`` changes whenever another process commits a change an engine must react
///   to (an unhop, a login or logout, a cancel, a new run).
///
/// The engine's tests run against any implementation (see `HopTestSupport`'s `TestBackend`).
package protocol HopStorage: Sendable {
    /// Where the data lives, for logs and messages (a file path, or a URL without its password).
    var location: String { get }
    /// Where the engine may run flow bodies: a store whose work runs on a thread of its own
    /// offers that thread, so that a body's reads and records reach it without a thread
    /// hand-off (the engine uses it while few runs execute); `nil` runs them on Swift's
    /// cooperative pool. Steps always run on the pool.
    var flowExecutor: (any TaskExecutor)? { get }

    /// The time by which this storage judges deadlines (durable sleeps, step timeouts), session
    /// expiry and leases, and dates its records: this machine's clock for a file; for a server
    /// shared by a fleet, the server's clock (as last measured), so that the fleet's machines
    /// need not agree on the time. The engine computes every deadline from it.
    func now() -> Date

    // MARK: Liveness and change notification

    /// A new engine incarnation labelled `label`, with the proof of liveness this storage supports.
    func makeIncarnation(label: String) -> Incarnation
    /// A value that changes whenever another process commits to the database. Throws
    /// `.replaced` once the database this storage has open is no longer the one other
    /// processes open (a file removed, or another put in its place; on a server, Hop's tables
    /// created again by a restore, as a write or ``checkSchema()`` found): the engine then stops.
    func changeVersion() async throws -> Int64
    /// Throws `.schemaTooNew` once a newer Hop has upgraded the database's schema past the
    /// version this storage opened it at (an operator's `hopctl migrate`, or the newer daemon,
    /// run before this process was stopped): the engine then stops, so that code of two
    /// releases does not write one database for longer than a look.
    func checkSchema() async throws

    // MARK: Durability

    /// Commits every coalesced write applied so far (``WriteDurability/coalesced``) now.
    func makeDurable() async throws
    /// Waits until every write applied so far is durable, without forcing a commit; throws when
    /// the writes of run `runID` (its creation, say) were lost to a failed commit.
    func waitUntilDurable(runID: Int64) async throws

    // MARK: Run lifecycle

    /// Starts a run of `flow` for `subject`, or returns the unfinished one (at most one exists);
    /// a new run is held by `owner` until `until`.
    func startRun(
        flow: String, subject: String, version: String, owner: String?, until: Date?, durability: WriteDurability
    ) async throws -> (run: RunRecord, created: Bool)
    /// Cancels the unfinished run of `flow` for `subject`; `.notFound` without one. With
    /// `runID`, refused unless that is the unfinished run (a retried cancel changes nothing).
    @discardableResult
    func cancelRun(flow: String, subject: String, runID: Int64?, reason: String) async throws -> RunRecord
    /// Records a new run of `flow` for `subject` that no engine holds, on `version` (the flow's
    /// newest run's when `nil`), for the first engine with that version to claim (`hopctl start`).
    /// Refused while the subject has an unfinished run of the flow, when `latest` is given and is
    /// not its latest run, and for a flow with no run here unless `allowingNewFlow`.
    @discardableResult
    func startNewRun(
        flow: String, subject: String, version: String?, allowingNewFlow: Bool, latest: ExpectedLatestRun?
    ) async throws -> RunRecord
    /// Removes the finished runs `pruning` selects, with their history, a batch per transaction;
    /// with `dryRun`, counts them and changes nothing.
    func prune(_ pruning: Pruning, dryRun: Bool) async throws -> PruneReport
    /// Ends the latest run of `flow` for `subject` and creates a new one that starts over, on
    /// `version` (the old run's when `nil`). With `runID`, refused unless that is the latest run
    /// (a retried restart changes nothing).
    @discardableResult
    func restartRun(flow: String, subject: String, runID: Int64?, version: String?) async throws -> RunRecord
    /// Starts a new run that takes the history of run `runID` (the latest when `nil`) through
    /// entry `seq` as done, on `version` (the old run's when `nil`); see `HopStore.forkRun`.
    func forkRun(
        flow: String, subject: String, runID: Int64?, through seq: Int64, version: String?
    ) async throws -> (old: RunRecord, new: RunRecord)
    /// Marks the run diverged: the flow code asked for another path than its history. With
    /// `following`, refused, changing nothing, unless the run's history ends at that entry (see
    /// ``record(_:runID:owner:following:durability:)``): a divergence judged on a history the
    /// database no longer holds is not recorded.
    @discardableResult
    func divergeRun(
        runID: Int64, step: String?, message: String, owner: String?, following: Int64?
    ) async throws -> HistoryEntry

    // MARK: Recording what a run does

    /// Applies `writes` for the run in order, as one write fenced by `owner`: all or none.
    /// Returns the history entry each one appended. With `following`, the number of the last
    /// history entry the writer recorded or read (the engine executing the run), refused,
    /// writing nothing, unless the run's history ends there: a database that lost the writer's
    /// last commits (a failover to a standby that lacked them) or that another writer changed
    /// is not written to as if it held what the writer saw.
    @discardableResult
    func record(
        _ writes: [RunWrite], runID: Int64, owner: String?, following: Int64?, durability: WriteDurability
    ) async throws -> [HistoryEntry]
    /// Ends the step in flight because its deadline passed, if `token` is its token.
    @discardableResult
    func recordTimeout(runID: Int64, token: String, owner: String?) async throws -> HistoryEntry
    /// Unhops `step`, on which the unfinished run of `flow` for `subject` is parked; with
    /// `runID`, only while that is the run; with `entry` too, only while the hop that history
    /// entry recorded is the parking (see ``HopStore/unhopParked(flow:subject:step:runID:entry:output:)``).
    func unhopParked(
        flow: String, subject: String, step: String, runID: Int64?, entry: Int64?, output: String?
    ) async throws -> (run: RunRecord, unhop: HistoryEntry)
    /// Records that a step threw; with `final`, the run fails. With `following`, refused,
    /// changing nothing, unless the run's history ends at that entry (see
    /// ``record(_:runID:owner:following:durability:)``).
    @discardableResult
    func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String?, following: Int64?
    ) async throws -> HistoryEntry

    // MARK: Reading runs

    /// The run with `id`, if it exists.
    func run(id: Int64) async throws -> RunRecord?
    /// The newest run of `flow` for `subject`, finished or not.
    func latestRun(flow: String, subject: String) async throws -> RunRecord?
    /// The history entry that entered the step in flight of each of `runIDs` that has one (a
    /// run id to an entry number): what names a parking in `hopctl unhop --run ID --entry N`.
    func stepEntries(runIDs: [Int64]) async throws -> [Int64: Int64]
    /// The history of a run in order; with `limit`, its last `limit` entries.
    func history(runID: Int64, limit: Int?) async throws -> [HistoryEntry]
    /// The histories of `runIDs`, each in order, read together.
    func histories(runIDs: [Int64]) async throws -> [Int64: [HistoryEntry]]
    /// The status and owner of each of `runIDs` that still exists.
    func statuses(of runIDs: [Int64]) async throws -> [Int64: (status: RunStatus, owner: String?)]

    // MARK: Ownership
    //
    // A lease ends at `until` by ``now()``; neither backend stores that time as such. Both take
    // its length (from now to `until`) and count it from when the write runs, so that a write that
    // waited (for a file's write lock another process held) still holds the run for as long as
    // asked. A file measures it by the machine's uptime clock (`UptimeClock`), which a step of the
    // wall clock does not move; a server shared by a fleet by its own clock (the length added to
    // the server's time in SQL), whatever the engines' machines say.

    /// Takes the run for `owner` until `until` unless another incarnation holds a live lease on it.
    func claim(runID: Int64, owner: String, until: Date) async throws -> RunRecord?
    /// Takes every run of `runIDs` that no other incarnation holds, together.
    func claim(runIDs: [Int64], owner: String, until: Date) async throws -> [RunRecord]
    /// Extends `owner`'s leases on `runIDs`; returns the runs whose lease was extended.
    @discardableResult
    func renewLeases(owner: String, runIDs: [Int64], until: Date) async throws -> Set<Int64>
    /// Gives up `owner`'s leases on the runs of `runIDs` (those it holds), in one transaction.
    func release(runIDs: [Int64], owner: String) async throws
    /// Releases the runs of incarnations proven dead, and forgets them; returns them with their run counts.
    @discardableResult
    func releaseRunsOfDeadIncarnations(except own: Incarnation) async throws -> [(owner: String, runs: Int)]
    /// Unfinished, unparked runs that no engine holds, of the given flows and, of each, of the
    /// given versions only (a run of another version is left for an engine that has it), oldest first.
    func claimableRuns(versions: [String: [String]], now: Date, limit: Int) async throws -> [RunRecord]
    /// Parked runs whose step's deadline has passed. The watch asks at every poll: a store may
    /// answer from what it last read, if it sees its own writes at once and those of other
    /// processes within a second (`PostgresStore`'s look at what comes due).
    func dueTimeouts(now: Date) async throws -> [RunRecord]

    // MARK: Subject state

    /// Whether `subject` has never used `feature` (or it was reset).
    func isFirstUse(subject: String, feature: String) async throws -> Bool
    /// Marks `feature` used by `subject` now, unless it already is.
    func markUsed(subject: String, feature: String) async throws
    /// The stored, unexpired session of `subject`.
    func session(subject: String) async throws -> StoredSession?
    /// Stores the session of `subject` and unhops its parked login steps; returns their runs.
    @discardableResult
    func storeSession(subject: String, userID: String, token: String, expiresAt: Date?) async throws -> [Int64]
    /// Removes the session of `subject` and re-routes its steps that lasted while it was stored;
    /// with `userID`, refused, changing nothing, when another user's session is stored.
    @discardableResult
    func deleteSession(subject: String, userID: String?) async throws -> (removed: Bool, rerouted: [Int64])
    /// Removes the sessions whose expiry has come, as logouts; returns the runs re-routed. Asked
    /// at every poll, as ``dueTimeouts(now:)`` is, and answered the same way.
    @discardableResult
    func expireSessions(now: Date) async throws -> [Int64]
    /// The daemon's fact `key` about `subject`.
    func fact(subject: String, key: String) async throws -> String?
    /// Stores the daemon's fact `key` = `value` about `subject`.
    func setFact(subject: String, key: String, value: String) async throws
}

extension HopStorage {
    /// Gives up `owner`'s lease on the run.
    package func release(runID: Int64, owner: String) async throws {
        try await release(runIDs: [runID], owner: owner)
    }

    /// Unhops `step`, on which the unfinished run of `flow` for `subject` is parked, whichever run
    /// and parking that is.
    package func unhopParked(
        flow: String, subject: String, step: String, output: String? = nil
    ) async throws -> (run: RunRecord, unhop: HistoryEntry) {
        try await unhopParked(flow: flow, subject: subject, step: step, runID: nil, entry: nil, output: output)
    }

    /// Removes the session of `subject`, whoever's it is.
    @discardableResult
    package func deleteSession(subject: String) async throws -> (removed: Bool, rerouted: [Int64]) {
        try await deleteSession(subject: subject, userID: nil)
    }

    /// The whole history of a run, in order.
    package func history(runID: Int64) async throws -> [HistoryEntry] { try await history(runID: runID, limit: nil) }

    /// Marks the run diverged, whatever its history ends at (see
    /// ``divergeRun(runID:step:message:owner:following:)``).
    @discardableResult
    package func divergeRun(
        runID: Int64, step: String?, message: String, owner: String? = nil
    ) async throws -> HistoryEntry {
        try await divergeRun(runID: runID, step: step, message: message, owner: owner, following: nil)
    }

    /// Records that a step threw, whatever the run's history ends at (see
    /// ``recordError(runID:step:message:final:owner:following:)``).
    @discardableResult
    package func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String? = nil
    ) async throws -> HistoryEntry {
        try await recordError(runID: runID, step: step, message: message, final: final, owner: owner, following: nil)
    }

    /// Applies `writes` for the run in order, whatever its history ends at (see
    /// ``record(_:runID:owner:following:durability:)``).
    @discardableResult
    package func record(
        _ writes: [RunWrite], runID: Int64, owner: String?, durability: WriteDurability
    ) async throws -> [HistoryEntry] {
        try await record(writes, runID: runID, owner: owner, following: nil, durability: durability)
    }

    /// Applies one write for the run (see ``record(_:runID:owner:following:durability:)``) and returns its entry.
    @discardableResult
    package func record(
        _ write: RunWrite, runID: Int64, owner: String? = nil, following: Int64? = nil,
        durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        guard
            let entry = try await record(
                [write], runID: runID, owner: owner, following: following, durability: durability
            ).first
        else {
            throw HopError(
                .sqlite, operation: write.operation(runID: runID), path: location,
                reason: "no history entry was written")
        }
        return entry
    }

    /// Records a hop of run `runID` to `step` with a fresh token.
    @discardableResult
    package func recordHop(
        runID: Int64, step: String, from: String? = nil, parks: Bool = false, wakeOn: WakeCondition? = nil,
        deadline: Date? = nil, owner: String? = nil
    ) async throws -> HistoryEntry {
        try await record(
            .hop(step: step, from: from, parks: parks, wakeOn: wakeOn, deadline: deadline), runID: runID, owner: owner)
    }

    /// Ends the step in flight of run `runID` with an unhop, if `token` is its token; by default
    /// from outside the engine (no owner), durably.
    @discardableResult
    package func recordUnhop(
        runID: Int64, token: String, output: String? = nil, owner: String? = nil, following: Int64? = nil,
        durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try await record(
            .unhop(token: token, output: output), runID: runID, owner: owner, following: following,
            durability: durability)
    }

    /// Records the value a condition had when run `runID` read it.
    @discardableResult
    package func recordDecision(
        runID: Int64, name: String, value: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try await record(.decision(name: name, value: value), runID: runID, owner: owner, durability: durability)
    }

    /// Records that run `runID` took the new branch of patch `name`.
    @discardableResult
    package func recordPatch(
        runID: Int64, name: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try await record(.patch(name: name), runID: runID, owner: owner, durability: durability)
    }

    /// Records a durable sleep of run `runID` until `deadline`.
    @discardableResult
    package func recordTimer(
        runID: Int64, name: String, deadline: Date, owner: String? = nil
    ) async throws -> HistoryEntry {
        try await record(.timer(name: name, deadline: deadline), runID: runID, owner: owner)
    }

    /// Marks `feature` used by the subject of run `runID` and records the effect, in one write.
    @discardableResult
    package func markUsed(
        runID: Int64, feature: String, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try await record(.markUsed(feature: feature), runID: runID, owner: owner, durability: durability)
    }

    /// Records that the flow body of run `runID` returned: the run is completed.
    @discardableResult
    package func completeRun(
        runID: Int64, owner: String? = nil, durability: WriteDurability = .now
    ) async throws -> HistoryEntry {
        try await record(.complete, runID: runID, owner: owner, durability: durability)
    }

    /// Starts a run of `flow` for `subject` that any engine may claim, durably, or returns the unfinished one.
    package func startRun(
        flow: String, subject: String, version: String
    ) async throws -> (run: RunRecord, created: Bool) {
        try await startRun(flow: flow, subject: subject, version: version, owner: nil, until: nil, durability: .now)
    }

    /// Stores the session of `subject` with no expiry.
    @discardableResult
    package func storeSession(subject: String, userID: String, token: String) async throws -> [Int64] {
        try await storeSession(subject: subject, userID: userID, token: token, expiresAt: nil)
    }
}

/// The name under which a run's history records that it marked `feature` used.
package func markUsedEffectName(_ feature: String) -> String { "markUsed(\(feature))" }
