import Foundation
import HopStore
import PostgresNIO
import Synchronization

/// One transaction of a ``PostgresStore``, handed to the code that must run inside one: the
/// helpers that read and change runs are its methods, so none of them runs outside a transaction.
///
/// A write locks the row of each run it changes (`FOR UPDATE`) before it reads the run's state,
/// so two writers of one run (an unhop and a timeout of the same hop) are serialized and the
/// second sees what the first did.
struct PostgresTransaction: Sendable {
    let connection: PostgresConnection
    let store: PostgresStore
    let operation: String
    /// The entry each run's history must end at when this transaction's next append to it
    /// inserts (``requireUnfinished(_:owner:following:operation:)``).
    let fences = Fences()

    /// A write's fence, checked again by the insert it leads to. The statement that locks a
    /// run's row reads where its history ends too, but under READ COMMITTED a statement that
    /// waited for the lock reads the history as it was before the wait: a write another client
    /// committed meanwhile (it held the row) is not in it. The insert is a statement of its own,
    /// run with the row locked, so it reads every write committed before.
    final class Fences: Sendable {
        let expected = Mutex<[Int64: Int64]>([:])
    }

    var location: String { store.url.redacted }

    func query<T>(_ sql: String, _ values: [PostgresValue], _ decode: (Row) throws -> T) async throws -> [T] {
        try await connection.decodedRows(of: PostgresValue.query(sql, values), decode)
    }

    func queryOne<T>(_ sql: String, _ values: [PostgresValue], _ decode: (Row) throws -> T) async throws -> T? {
        try await query(sql, values, decode).first
    }

    /// Runs a statement; returns how many rows it returned (write `RETURNING 1` to count rows changed).
    @discardableResult
    func run(_ sql: String, _ values: [PostgresValue] = []) async throws -> Int {
        try await connection.decodedRows(of: PostgresValue.query(sql, values)) { _ in () }.count
    }

    /// Sends the change notification with the transaction: other stores' ``PostgresStore/changeVersion()`` moves at its commit.
    ///
    /// At `COMMIT`, the server takes a lock that orders every transaction that notifies (of any
    /// database of the server) and holds it through the commit: a wait of another commit's
    /// length, which a database's `lock_timeout` (100 ms under load) refused, failing the commit
    /// with "canceling statement due to lock timeout". So the rest of a transaction that
    /// notifies has no `lock_timeout`: call this after its last write, when only reads follow.
    func notifyChange() async throws {
        try await run(
            "SELECT pg_notify($1, $2), set_config('lock_timeout', '0', true)",
            [.text(PostgresStore.channel), .text(store.instance)])
    }

    func refuse(_ code: HopError.Code, _ operation: String, _ reason: String, hint: String? = nil) -> HopError {
        HopError(code, operation: operation, path: location, reason: reason, hint: hint)
    }

    // MARK: Subjects

    /// Takes, until the transaction ends, the lock that orders the transactions of `subject`
    /// that store or remove its session with those that park one of its runs until a session is
    /// stored or removed. Each reads what the other writes (the park reads the session; the
    /// login or logout looks for parked runs to wake), and under READ COMMITTED neither sees the
    /// other's uncommitted write: without the lock, a login at the moment a run parked at login
    /// left the run parked, with the session stored, for good (a quarter of 200 tries).
    ///
    /// A transaction-level advisory lock on two keys (the class `hop.subject`, the subject's
    /// hash; another subject with the same hash only waits its turn), taken before any row of the
    /// subject's runs or session, so that two such transactions never wait for each other. An
    /// engine's liveness lock is a one-key advisory lock: the two never meet.
    ///
    /// The wait for it lasts as long as the other transaction, not an operator's lock, so a
    /// database's `lock_timeout` does not apply to it (``withoutLockTimeout(_:)``); it still
    /// applies to every lock the transaction waits for after it.
    func lockSubject(_ subject: String) async throws {
        try await lockSubjects([subject])
    }

    /// ``lockSubject(_:)`` for each of `subjects`, in one statement, in the order of their names
    /// (as any two transactions that lock several take them, so neither waits for the other).
    func lockSubjects(_ subjects: [String]) async throws {
        guard !subjects.isEmpty else { return }
        try await withoutLockTimeout {
            try await run(
                "SELECT pg_advisory_xact_lock(hashtext('hop.subject'), hashtext(s)) FROM unnest($1::text[]) AS s",
                [.texts(subjects.sorted())])
        }
    }

    /// ``lockSubject(_:)`` for the subject of run `runID`.
    func lockSubject(ofRun runID: Int64) async throws {
        try await withoutLockTimeout {
            try await run(
                "SELECT pg_advisory_xact_lock(hashtext('hop.subject'), hashtext(subject)) FROM runs WHERE id = $1",
                [.int(runID)])
        }
    }

    /// Runs `body` with no `lock_timeout`, then puts back the one of the connection (its
    /// database's, its role's or the server's: Hop never sets one of its own).
    private func withoutLockTimeout(_ body: () async throws -> Int) async throws {
        try await run("SET LOCAL lock_timeout = 0")
        _ = try await body()
        try await run("SET LOCAL lock_timeout TO DEFAULT")
    }

    // MARK: Runs

    func run(id runID: Int64, locking: Bool = false) async throws -> RunRecord? {
        try await queryOne(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE id = $1\(locking ? " FOR UPDATE" : "")", [.int(runID)],
            RunRecord.init(pg:))
    }

    func requireRun(_ runID: Int64, operation: String) async throws -> RunRecord {
        guard let run = try await run(id: runID) else {
            throw refuse(.notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
        }
        return run
    }

    /// The unfinished run of `flow` for `subject`, its row locked.
    func unfinishedRun(flow: String, subject: String) async throws -> RunRecord? {
        try await queryOne(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE flow = $1 AND subject = $2 AND status IN \(RunStatus.pgUnfinished) FOR UPDATE",
            [.text(flow), .text(subject)], RunRecord.init(pg:))
    }

    /// Checks run `runID`, when a steering command names it so that a retry changes nothing,
    /// against `current`, the run the command acts on (`StorageRules.checkNamedRun`): the
    /// named run is read only when it is another.
    func checkNamedRun(
        _ runID: Int64?, current: RunRecord?, flow: String, subject: String, verb: String, operation: String
    ) async throws {
        guard let runID else { return }
        try StorageRules(location: location).checkNamedRun(
            runID, named: current?.id == runID ? current : try await run(id: runID), current: current, flow: flow,
            subject: subject, verb: verb, operation: operation)
    }

    /// The newest run of `flow` for `subject`, finished or not, its row locked.
    func latestRun(flow: String, subject: String) async throws -> RunRecord? {
        try await queryOne(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE flow = $1 AND subject = $2 ORDER BY id DESC LIMIT 1 FOR UPDATE",
            [.text(flow), .text(subject)], RunRecord.init(pg:))
    }

    /// The newest run of `flow` for `subject`, its row locked; `.notFound` without one.
    func requireLatestRun(flow: String, subject: String, operation: String) async throws -> RunRecord {
        guard let latest = try await latestRun(flow: flow, subject: subject) else {
            throw refuse(
                .notFound, operation, "there is no run of flow '\(flow)' for subject '\(subject)'",
                hint: "Check the names with `hopctl status`")
        }
        return latest
    }

    /// Locks run `runID` and checks that it is unfinished and, with `owner`, held by that engine;
    /// with `following`, that its history ends at that entry (read in the same statement).
    func requireUnfinished(
        _ runID: Int64, owner: String?, following: Int64? = nil, operation: String
    ) async throws -> RunRecord {
        // With the table the row is in: a write to a run is checked against a restored database;
        // and the number of its last history entry, a search of the history's primary key.
        guard
            let found = try await queryOne(
                """
                SELECT \(RunRecord.pgColumns), tableoid::bigint,
                    (SELECT coalesce(max(seq), 0) FROM history WHERE run_id = $1)
                FROM runs WHERE id = $1 FOR UPDATE
                """, [.int(runID)],
                {
                    (
                        run: try RunRecord(pg: $0), table: try $0.int64(RunRecord.pgColumnCount),
                        last: try $0.int64(RunRecord.pgColumnCount + 1)
                    )
                })
        else {
            // A run this process knows may be missing from a restored database: say so, not "not found".
            let table = try await queryOne("SELECT \(PostgresStore.runsTableNow)", []) { try $0.int64(0) }
            try store.checkNotReplaced(runsTable: table ?? store.runsTable, operation: operation)
            throw refuse(.notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
        }
        try store.checkNotReplaced(runsTable: found.table, operation: operation)
        let run = found.run
        guard run.status.isUnfinished else {
            throw refuse(
                .refused, operation,
                "run \(runID) of \(run.flow) for \(run.subject) is \(run.status.rawValue) and no longer advances",
                hint: "Start it over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`")
        }
        // Fenced: an engine writes to a run only while it holds it.
        guard owner == nil || run.owner == owner else {
            let holder = run.owner.map { "another engine (\(Incarnation.label(of: $0)))" } ?? "no engine"
            throw refuse(
                .refused, operation, "run \(runID) is held by \(holder); this engine no longer executes it",
                hint: "Nothing to do: the engine that holds the run carries it on")
        }
        try StorageRules(location: location).checkFollows(
            runID: runID, last: found.last, following: following, operation: operation)
        if let following { fences.expected.withLock { $0[runID] = following } }
        return run
    }

    func requireRunning(
        _ runID: Int64, owner: String?, following: Int64? = nil, operation: String
    ) async throws -> RunRecord {
        let run = try await requireUnfinished(runID, owner: owner, following: following, operation: operation)
        guard run.status == .running else {
            throw refuse(.refused, operation, "run \(runID) is \(run.status.rawValue)")
        }
        return run
    }

    func noUnfinishedRun(flow: String, subject: String, operation: String) -> HopError {
        refuse(
            .notFound, operation, "there is no unfinished run of flow '\(flow)' for subject '\(subject)'",
            hint: "Check the names with `hopctl status`")
    }

    /// Inserts a new running run, held by `owner` for `lease` milliseconds from when the statement
    /// runs; the unique index refuses a second unfinished run of the subject.
    func insertRun(
        flow: String, subject: String, version: String, owner: String? = nil, lease: Int64? = nil
    ) async throws -> RunRecord {
        let now = Clock.milliseconds(store.now())
        guard
            let run = try await queryOne(
                """
                INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at, owner, last_owner, lease_expires_at)
                VALUES ($1, $2, $3, 'running', $4, $4, $5, $5, \(PostgresStore.serverNow) + $6)
                RETURNING \(RunRecord.pgColumns)
                """,
                [
                    .text(flow), .text(subject), .text(version), .int(now), .optional(owner),
                    .optional(lease),
                ], RunRecord.init(pg:))
        else {
            throw refuse(.postgres, operation, "the run was not inserted")
        }
        return run
    }

    /// Ends the run with `status`: no token, no wake-up, no owner.
    func setStatus(_ runID: Int64, _ status: RunStatus) async throws {
        try await run(
            """
            UPDATE runs SET status = $2, current_token = NULL, wake_on = NULL, wake_at = NULL, owner = NULL,
                lease_expires_at = NULL, updated_at = $3
            WHERE id = $1
            """, [.int(runID), .text(status.rawValue), .int(Clock.milliseconds(store.now()))])
    }

    // MARK: History

    /// Appends one entry to run `runID`'s history (whose row the caller has locked) and, unless
    /// the caller updates the run's row itself, its `updated_at`.
    @discardableResult
    func append(
        runID: Int64, _ kind: HistoryKind, step: String? = nil, token: String? = nil, value: String? = nil,
        touchesRun: Bool = true
    ) async throws -> HistoryEntry {
        let now = Clock.milliseconds(store.now())
        // The first append of a fenced write inserts only where the history ends at the fence.
        let fence = fences.expected.withLock { $0.removeValue(forKey: runID) }
        guard
            let seq = try await queryOne(
                """
                INSERT INTO history (run_id, seq, kind, step, token, value, at)
                SELECT $1, coalesce(max(seq), 0) + 1, $2, $3, $4, $5, $6 FROM history WHERE run_id = $1
                HAVING $7::bigint IS NULL OR coalesce(max(seq), 0) = $7
                RETURNING seq
                """,
                [
                    .int(runID), .text(kind.rawValue), .optional(step), .optional(token), .optional(value), .int(now),
                    .optional(fence),
                ],
                { try $0.int64(0) })
        else {
            if fence != nil {
                let last = try await queryOne(
                    "SELECT coalesce(max(seq), 0) FROM history WHERE run_id = $1", [.int(runID)]
                ) { try $0.int64(0) }
                try StorageRules(location: location).checkFollows(
                    runID: runID, last: last ?? 0, following: fence, operation: operation)
            }
            throw refuse(.postgres, operation, "the history entry of run \(runID) was not inserted")
        }
        if touchesRun {
            try await run("UPDATE runs SET updated_at = $2 WHERE id = $1", [.int(runID), .int(now)])
        }
        return HistoryEntry.recorded(
            runID: runID, seq: seq, kind: kind, step: step, token: token, value: value, at: Clock.date(now))
    }

    /// What a fork of run `runID` through entry `seq` is checked against (``ForkPoint``), read
    /// in a few small results rather than by reading the run's history.
    func forkPoint(of runID: Int64, through seq: Int64) async throws -> ForkPoint {
        let lastSeq =
            try await queryOne("SELECT coalesce(max(seq), 0) FROM history WHERE run_id = $1", [.int(runID)]) {
                try $0.int64(0)
            } ?? 0
        let links = try await query(
            "SELECT value FROM history WHERE run_id = $1 AND kind = 'fork'", [.int(runID)]
        ) { try $0.optionalText(0) }
        let hop = try await queryOne(
            "SELECT seq, step, token FROM history WHERE run_id = $1 AND seq <= $2 AND kind = 'hop' ORDER BY seq DESC LIMIT 1",
            [.int(runID), .int(seq)]
        ) { (try $0.int64(0), try $0.optionalText(1), try $0.optionalText(2)) }
        var ended = false
        if let hop {
            ended =
                try await queryOne(
                    """
                    SELECT 1 FROM history WHERE run_id = $1 AND seq <= $2
                        AND kind IN \(HistoryKind.pgStepEnds) AND token IS NOT DISTINCT FROM $3 LIMIT 1
                    """, [.int(runID), .int(seq), .optional(hop.2)]
                ) { _ in true } ?? false
        }
        return ForkPoint(
            lastSeq: lastSeq, links: links, lastHop: hop.map { (seq: $0.0, step: $0.1) }, lastHopEnded: ended)
    }

    /// Ends the step in flight of `run` (locked) with an unhop, a timeout or a re-route, if `token` is its token.
    @discardableResult
    func endStep(
        _ run: RunRecord, token: String, kind: HistoryKind, value: String?, operation: String
    ) async throws
        -> HistoryEntry
    {
        guard let step = run.currentStep, let current = run.currentToken, current == token else {
            let earlier = try await queryOne(
                "SELECT step, kind FROM history WHERE run_id = $1 AND kind IN \(HistoryKind.pgStepEnds) AND token = $2",
                [.int(run.id), .text(token)]
            ) { (try $0.text(0), try $0.text(1)) }
            throw StorageRules(location: location).staleToken(
                runID: run.id, currentStep: run.currentStep, currentToken: run.currentToken,
                earlier: earlier.map { (step: $0.0, kind: $0.1) }, operation: operation)
        }
        let event = try await append(runID: run.id, kind, step: step, token: token, value: value, touchesRun: false)
        try await self.run(
            """
            UPDATE runs SET current_step = NULL, current_token = NULL, wake_on = NULL, wake_at = NULL, status = 'running',
                updated_at = $2
            WHERE id = $1
            """, [.int(run.id), .int(Clock.milliseconds(store.now()))])
        return event
    }

    // MARK: Sessions

    /// The stored, unexpired session of `subject`.
    func session(subject: String) async throws -> StoredSession? {
        try await queryOne(
            "SELECT user_id, token, created_at, expires_at FROM sessions WHERE subject = $1 AND (expires_at IS NULL OR expires_at > $2)",
            [.text(subject), .int(Clock.milliseconds(store.now()))], StoredSession.decoder(subject: subject))
    }

    /// Unhops the parked steps of `subject` that wait for a session, with `{"userID": …}`.
    @discardableResult
    func unhopLoginSteps(subject: String, userID: String, operation: String) async throws -> [Int64] {
        try await endParkedSteps(
            subject: subject, wakeOn: .sessionStored, kind: .unhop, value: ["userID": userID], operation: operation)
    }

    /// Ends with a re-route the parked steps of `subject` that last only while a session is stored.
    @discardableResult
    func rerouteSessionSteps(subject: String, reason: String, operation: String) async throws -> [Int64] {
        try await endParkedSteps(
            subject: subject, wakeOn: .sessionRemoved, kind: .reroute, value: ["reason": reason], operation: operation)
    }

    private func endParkedSteps(
        subject: String, wakeOn: WakeCondition, kind: HistoryKind, value: [String: String], operation: String
    ) async throws -> [Int64] {
        let waiting = try await query(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE subject = $1 AND status = 'parked' AND wake_on = $2 ORDER BY id FOR UPDATE",
            [.text(subject), .text(wakeOn.rawValue)], RunRecord.init(pg:))
        let json = String(decoding: try JSONEncoder().encode(value), as: UTF8.self)
        for run in waiting {
            guard let token = run.currentToken else { continue }
            try await endStep(run, token: token, kind: kind, value: json, operation: operation)
        }
        return waiting.map(\.id)
    }
}

extension RunRecord {
    /// The columns ``init(pg:)`` reads, in order.
    static let pgColumns =
        "id, flow, subject, flow_version, status, current_step, current_token, wake_on, owner, lease_expires_at, created_at, updated_at, wake_at"

    /// ``pgColumns`` with each lease's end as the store judges leases (``PostgresStore/leaseRunOut(grace:)``):
    /// not before the grace after the server's start (the placeholder `grace`, bound to
    /// ``PostgresStore/graceAfterServerStart``) has passed, once an engine is back on the server
    /// (``PostgresStore/serverFirstSeen``). For listings an operator reads (`hopctl status`):
    /// after a restart or a failover longer than a lease, every lease's end has passed by the
    /// server's clock, yet no engine takes the run until its owner had the grace to renew it.
    /// Read as it is stored, such a lease showed "expired" for those seconds, while its owner
    /// still held the run and ran its step.
    static func pgColumnsJudgingLeases(grace: String) -> String {
        // `greatest` ignores a NULL: before an engine is back, the lease's stored end.
        let judged =
            "CASE WHEN lease_expires_at IS NULL THEN NULL ELSE greatest(lease_expires_at, "
            + PostgresStore.serverFirstSeen + " + " + grace + ") END"
        return pgColumns.replacingOccurrences(of: "lease_expires_at", with: judged)
    }

    /// How many columns ``pgColumns`` names: the index of a column a statement selects after them.
    static let pgColumnCount = pgColumns.split(separator: ",").count

    /// ``pgColumns`` qualified by the table, for a statement that joins `runs` to another.
    static let pgQualifiedColumns = pgColumns.split(separator: ",")
        .map { "runs." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")

    init(pg row: Row) throws {
        self.init(
            id: try row.int64(0), flow: try row.text(1), subject: try row.text(2), flowVersion: try row.text(3),
            status: RunStatus(rawValue: try row.text(4)) ?? .failed, currentStep: try row.optionalText(5),
            createdAt: Clock.date(try row.int64(10)), updatedAt: Clock.date(try row.int64(11)))
        currentToken = try row.optionalText(6)
        wakeOn = try row.optionalText(7).flatMap(WakeCondition.init(rawValue:))
        owner = try row.optionalText(8)
        leaseExpiresAt = try row.optionalInt64(9).map(Clock.date)
        wakeAt = try row.optionalInt64(12).map(Clock.date)
    }
}

extension HistoryEntry {
    /// The columns ``init(pg:)`` reads, in order.
    static let pgColumns = "run_id, seq, kind, step, token, value, at"

    init(pg row: Row) throws {
        self = .recorded(
            runID: try row.int64(0), seq: try row.int64(1), kind: HistoryKind(rawValue: try row.text(2)) ?? .error,
            step: try row.optionalText(3), token: try row.optionalText(4), value: try row.optionalText(5),
            at: Clock.date(try row.int64(6)))
    }
}

extension StoredSession {
    /// Reads `user_id, token, created_at, expires_at` as the session of `subject`.
    static func decoder(subject: String) -> @Sendable (Row) throws -> StoredSession {
        { row in
            StoredSession.stored(
                subject: subject, userID: try row.text(0), token: try row.text(1),
                createdAt: Clock.date(try row.int64(2)), expiresAt: try row.optionalInt64(3).map(Clock.date))
        }
    }
}

extension RunStatus {
    /// The unfinished statuses as an SQL list of constants of the code (never values from outside).
    static let pgUnfinished = "('running', 'parked')"
}

extension HistoryKind {
    /// The kinds that end a step, as an SQL list of constants of the code.
    static let pgStepEnds = "('unhop', 'timeout', 'reroute')"

    /// The kinds replay matches against the flow code, as an SQL list of constants of the code.
    static let pgReplayed = "(" + allCases.filter(\.isReplayed).map { "'\($0.rawValue)'" }.joined(separator: ", ") + ")"
}
