import Foundation
import HopStore
import HopTestSupport
import Synchronization

/// A storage that forwards every call to `base` but fails the calls a test names, as a database
/// that fails (an I/O error: ``HopError/isDatabaseFailure``) fails them: before the call reaches
/// the database, so it changes nothing. For the engine's paths that only a failing database takes.
final class FaultyStorage: HopStorage {
    let base: any HopStorage
    private struct Faults {
        /// How many more times each call fails, by its name as `#function` gives it.
        var named: [String: Int] = [:]
        /// The error each named call fails with (an I/O error when not set).
        var codes: [String: HopError.Code] = [:]
        /// The calls that reached this storage so far, and the number of the one to fail.
        var calls = 0
        var failing: Int?
        var injected = 0
        /// The calls in order, the failed ones marked.
        var trace: [String] = []
        /// The calls of each name in order, the failed ones marked: what a test counts while it
        /// waits, without joining and splitting the whole trace at every look of the wait (at a
        /// poll every 5–10 ms, tens of thousands of calls by the end of a long wait).
        var byName: [String: [String]] = [:]
        /// What the releases wait for before they reach the database, if anything.
        var heldReleases: Gate?
        /// What the lease renewals, and the claims unless `claimsPass`, wait for before they
        /// reach the database, if anything.
        var heldLeases: Gate?
        var claimsPass = false
    }
    private let faults = Mutex(Faults())

    init(_ base: any HopStorage) { self.base = base }

    /// Fails the next `times` calls named `call` (`"histories(runIDs:)"`, as `#function` gives it),
    /// with an error of kind `code`.
    func fail(_ call: String, times: Int = 1, as code: HopError.Code = .ioFailure) {
        faults.withLock {
            $0.named[call, default: 0] += times
            $0.codes[call] = code
        }
    }

    /// Holds every release until `gate` opens, as a database slow to answer it would (it fails
    /// as it would have then); the trace notes when each held release ended.
    func holdReleases(until gate: Gate) { faults.withLock { $0.heldReleases = gate } }

    /// Holds every lease renewal and claim until `gate` opens, as a database cut off from the
    /// engine would: unanswered, neither failed nor done. With `claimsPass`, the renewals only.
    func holdLeases(until gate: Gate, claimsPass: Bool = false) {
        faults.withLock {
            $0.heldLeases = gate
            $0.claimsPass = claimsPass
        }
    }

    private func passLeaseGate(claim: Bool = false) async {
        await faults.withLock { claim && $0.claimsPass ? nil : $0.heldLeases }?.wait()
    }

    /// Fails the `number`th call from now, whichever it is (1: the next).
    func failCall(number: Int) { faults.withLock { $0.failing = $0.calls + number } }

    /// How many failures of `call` are still to come.
    func pendingFaults(_ call: String) -> Int { faults.withLock { $0.named[call] ?? 0 } }

    /// How many calls failed so far.
    var injectedFaults: Int { faults.withLock { $0.injected } }

    /// The calls so far in order, each failed one marked "(failed)": for a test's message.
    var trace: String { faults.withLock { $0.trace.joined(separator: ", ") } }

    /// How many calls named `call` succeeded so far.
    func calls(_ call: String) -> Int { faults.withLock { $0.byName[call]?.count { $0 == call } ?? 0 } }

    /// The calls named `call` so far in order, each failed one marked "(failed)".
    func trace(of call: String) -> [String] { faults.withLock { $0.byName[call] ?? [] } }

    private func check(_ call: String = #function) throws {
        let failure: HopError.Code? = faults.withLock { faults in
            faults.calls += 1
            var code = HopError.Code.ioFailure
            if faults.failing == faults.calls {
                faults.failing = nil
            } else if let left = faults.named[call], left > 0 {
                faults.named[call] = left - 1
                code = faults.codes[call] ?? code
            } else {
                faults.trace.append(call)
                faults.byName[call, default: []].append(call)
                return nil
            }
            faults.injected += 1
            faults.trace.append(call + " (failed)")
            faults.byName[call, default: []].append(call + " (failed)")
            return code
        }
        if let failure {
            throw HopError(
                failure, operation: call, path: base.location, reason: "\(failure) (injected by the test)")
        }
    }

    var location: String { base.location }
    var flowExecutor: (any TaskExecutor)? { base.flowExecutor }
    func now() -> Date { base.now() }
    func makeIncarnation(label: String) -> Incarnation { base.makeIncarnation(label: label) }

    func changeVersion() async throws -> Int64 {
        try check()
        return try await base.changeVersion()
    }

    func checkSchema() async throws {
        try check()
        try await base.checkSchema()
    }

    func makeDurable() async throws {
        try check()
        try await base.makeDurable()
    }

    func waitUntilDurable(runID: Int64) async throws {
        try check()
        try await base.waitUntilDurable(runID: runID)
    }

    func startRun(
        flow: String, subject: String, version: String, owner: String?, until: Date?, durability: WriteDurability
    ) async throws -> (run: RunRecord, created: Bool) {
        try check()
        return try await base.startRun(
            flow: flow, subject: subject, version: version, owner: owner, until: until, durability: durability)
    }

    func cancelRun(flow: String, subject: String, runID: Int64?, reason: String) async throws -> RunRecord {
        try check()
        return try await base.cancelRun(flow: flow, subject: subject, runID: runID, reason: reason)
    }

    func startNewRun(
        flow: String, subject: String, version: String?, allowingNewFlow: Bool, latest: ExpectedLatestRun?
    ) async throws -> RunRecord {
        try check()
        return try await base.startNewRun(
            flow: flow, subject: subject, version: version, allowingNewFlow: allowingNewFlow, latest: latest)
    }

    func prune(_ pruning: Pruning, dryRun: Bool) async throws -> PruneReport {
        try check()
        return try await base.prune(pruning, dryRun: dryRun)
    }

    func restartRun(flow: String, subject: String, runID: Int64?, version: String?) async throws -> RunRecord {
        try check()
        return try await base.restartRun(flow: flow, subject: subject, runID: runID, version: version)
    }

    func forkRun(
        flow: String, subject: String, runID: Int64?, through seq: Int64, version: String?
    ) async throws -> (old: RunRecord, new: RunRecord) {
        try check()
        return try await base.forkRun(flow: flow, subject: subject, runID: runID, through: seq, version: version)
    }

    func divergeRun(
        runID: Int64, step: String?, message: String, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        try check()
        return try await base.divergeRun(runID: runID, step: step, message: message, owner: owner, following: following)
    }

    func record(
        _ writes: [RunWrite], runID: Int64, owner: String?, following: Int64?, durability: WriteDurability
    ) async throws -> [HistoryEntry] {
        try check()
        return try await base.record(
            writes, runID: runID, owner: owner, following: following, durability: durability)
    }

    func recordTimeout(runID: Int64, token: String, owner: String?) async throws -> HistoryEntry {
        try check()
        return try await base.recordTimeout(runID: runID, token: token, owner: owner)
    }

    func unhopParked(
        flow: String, subject: String, step: String, runID: Int64?, entry: Int64?, output: String?
    ) async throws -> (run: RunRecord, unhop: HistoryEntry) {
        try check()
        return try await base.unhopParked(
            flow: flow, subject: subject, step: step, runID: runID, entry: entry, output: output)
    }

    func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        try check()
        return try await base.recordError(
            runID: runID, step: step, message: message, final: final, owner: owner, following: following)
    }

    func run(id: Int64) async throws -> RunRecord? {
        try check()
        return try await base.run(id: id)
    }

    func latestRun(flow: String, subject: String) async throws -> RunRecord? {
        try check()
        return try await base.latestRun(flow: flow, subject: subject)
    }

    func stepEntries(runIDs: [Int64]) async throws -> [Int64: Int64] {
        try check()
        return try await base.stepEntries(runIDs: runIDs)
    }

    func history(runID: Int64, limit: Int?) async throws -> [HistoryEntry] {
        try check()
        return try await base.history(runID: runID, limit: limit)
    }

    func histories(runIDs: [Int64]) async throws -> [Int64: [HistoryEntry]] {
        try check()
        return try await base.histories(runIDs: runIDs)
    }

    func statuses(of runIDs: [Int64]) async throws -> [Int64: (status: RunStatus, owner: String?)] {
        try check()
        return try await base.statuses(of: runIDs)
    }

    func claim(runID: Int64, owner: String, until: Date) async throws -> RunRecord? {
        await passLeaseGate(claim: true)
        try check()
        return try await base.claim(runID: runID, owner: owner, until: until)
    }

    func claim(runIDs: [Int64], owner: String, until: Date) async throws -> [RunRecord] {
        await passLeaseGate(claim: true)
        try check()
        return try await base.claim(runIDs: runIDs, owner: owner, until: until)
    }

    func renewLeases(owner: String, runIDs: [Int64], until: Date) async throws -> Set<Int64> {
        await passLeaseGate()
        try check()
        return try await base.renewLeases(owner: owner, runIDs: runIDs, until: until)
    }

    func release(runIDs: [Int64], owner: String) async throws {
        let gate = faults.withLock { $0.heldReleases }
        await gate?.wait()
        try check()
        try await base.release(runIDs: runIDs, owner: owner)
        if gate != nil { faults.withLock { $0.trace.append("release ended") } }
    }

    func releaseRunsOfDeadIncarnations(except own: Incarnation) async throws -> [(owner: String, runs: Int)] {
        try check()
        return try await base.releaseRunsOfDeadIncarnations(except: own)
    }

    func claimableRuns(versions: [String: [String]], now: Date, limit: Int) async throws -> [RunRecord] {
        try check()
        return try await base.claimableRuns(versions: versions, now: now, limit: limit)
    }

    func dueTimeouts(now: Date) async throws -> [RunRecord] {
        try check()
        return try await base.dueTimeouts(now: now)
    }

    func isFirstUse(subject: String, feature: String) async throws -> Bool {
        try check()
        return try await base.isFirstUse(subject: subject, feature: feature)
    }

    func markUsed(subject: String, feature: String) async throws {
        try check()
        try await base.markUsed(subject: subject, feature: feature)
    }

    func session(subject: String) async throws -> StoredSession? {
        try check()
        return try await base.session(subject: subject)
    }

    func storeSession(subject: String, userID: String, token: String, expiresAt: Date?) async throws -> [Int64] {
        try check()
        return try await base.storeSession(subject: subject, userID: userID, token: token, expiresAt: expiresAt)
    }

    func deleteSession(subject: String, userID: String?) async throws -> (removed: Bool, rerouted: [Int64]) {
        try check()
        return try await base.deleteSession(subject: subject, userID: userID)
    }

    func expireSessions(now: Date) async throws -> [Int64] {
        try check()
        return try await base.expireSessions(now: now)
    }

    func fact(subject: String, key: String) async throws -> String? {
        try check()
        return try await base.fact(subject: subject, key: key)
    }

    func setFact(subject: String, key: String, value: String) async throws {
        try check()
        try await base.setFact(subject: subject, key: key, value: value)
    }
}
