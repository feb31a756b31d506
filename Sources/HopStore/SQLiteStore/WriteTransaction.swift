#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One write transaction of the store, handed to the code that must run inside one (as GRDB
/// hands its `Database` to a write block): the helpers that read and change runs within the
/// caller's transaction are its methods, so none of them can run outside a transaction.
struct WriteTransaction {
    let connection: Connection
    /// What the transaction does, for error messages.
    let operation: String

    var path: String { connection.path }

    @discardableResult
    func run(_ sql: String, _ arguments: [SQLValue], operation: String) throws -> Int {
        try connection.run(sql, arguments, operation: operation)
    }

    func query<T>(_ sql: String, _ arguments: [SQLValue], operation: String, _ map: (Row) throws -> T) throws -> [T] {
        try connection.query(sql, arguments, operation: operation, map)
    }

    func queryOne<T>(_ sql: String, _ arguments: [SQLValue], operation: String, _ map: (Row) throws -> T) throws -> T? {
        try connection.queryOne(sql, arguments, operation: operation, map)
    }

    /// Runs `body` in a savepoint: when it throws, what it changed is undone and the
    /// transaction goes on as before it.
    func atomically<T>(_ body: () throws -> T) throws -> T {
        try run("SAVEPOINT hop_writes", [], operation: operation)
        let mark = connection.totalChanges
        do {
            let result = try body()
            try run("RELEASE hop_writes", [], operation: operation)
            return result
        } catch {
            if connection.isInTransaction, (try? run("ROLLBACK TO hop_writes", [], operation: operation)) != nil,
                (try? run("RELEASE hop_writes", [], operation: operation)) != nil
            {
                connection.undoChanges(since: mark)
            }
            throw error
        }
    }

    func refuse(_ code: HopError.Code, _ operation: String, _ reason: String, hint: String? = nil) -> HopError {
        HopError(code, operation: operation, path: path, reason: reason, hint: hint)
    }
}

extension WriteTransaction {
    /// Ends the step in flight of `run` with an unhop, a timeout or a re-route, if `token` is its token.
    @discardableResult
    func endStep(
        _ run: RunHead, token: String, kind: HistoryKind, value: String?, updatesRun: Bool = true,
        operation: String
    ) throws -> HistoryEntry {
        guard let step = run.currentStep, let current = run.currentToken, current == token else {
            let earlier = try connection.queryOne(
                "SELECT step, kind FROM history WHERE run_id = ?1 AND kind IN \(HistoryKind.stepEndsSQL) AND token = ?2",
                [.integer(run.id), .text(token)], operation: operation
            ) { ($0.text(0), $0.text(1)) }
            throw StorageRules(location: path).staleToken(
                runID: run.id, currentStep: run.currentStep, currentToken: run.currentToken,
                earlier: earlier.map { (step: $0.0, kind: $0.1) }, operation: operation)
        }
        let event = try append(
            runID: run.id, kind, step: step, token: token, value: value, after: run.lastSeq, touchesRun: false,
            operation: operation)
        if run.status == .running {
            // The caller's next write clears the step in its own update of the run's row.
            guard updatesRun else { return event }
            // A step of a running run (never scheduled to wake): only the step changes, so the
            // indexes on status and wake-up time are not rewritten.
            try connection.run(
                "UPDATE runs SET current_step = NULL, current_token = NULL, updated_at = ?2 WHERE id = ?1",
                [.integer(run.id), .integer(Clock.nowMilliseconds())], operation: operation)
        } else {
            try connection.run(
                """
                UPDATE runs SET current_step = NULL, current_token = NULL, wake_on = NULL, wake_at = NULL, wake_boot = NULL, wake_uptime = NULL,
                    status = \(RunStatus.running.sql), updated_at = ?2
                WHERE id = ?1
                """,
                [.integer(run.id), .integer(Clock.nowMilliseconds())], operation: operation)
        }
        return event
    }

    /// Appends one history entry to run `runID` and, unless the caller updates the run's row
    /// itself (`touchesRun: false`), its `updated_at`.
    ///
    /// - Parameter lastSeq: the number of the run's last entry, when the caller read it in this
    ///   write (``RunHead/lastSeq``) and appended nothing since; read here otherwise.
    /// - Parameter endsStep: the update of the run's row also clears its step, which an unhop
    ///   earlier in this write ended (``recordUnhop(token:output:then:runID:owner:)``).
    /// - Parameter deadline: the deadline `value` records (a timer's, a hop's with a timeout):
    ///   kept by the uptime clock too (schema 11), so that a daemon that reads it back after a
    ///   step of the wall clock waits as long as it had left.
    @discardableResult
    func append(
        runID: Int64, _ kind: HistoryKind, step: String? = nil, token: String? = nil, value: String? = nil,
        deadline: Date? = nil, after lastSeq: Int64? = nil, touchesRun: Bool = true, endsStep: Bool = false,
        operation: String
    ) throws -> HistoryEntry {
        let now = Clock.nowMilliseconds()
        let clock = UptimeClock.machine
        let uptime = deadline.flatMap(clock.uptime(at:))
        // The next number of the run's history, then the entry: a single-row INSERT. (One
        // `INSERT … SELECT … RETURNING` statement costs three times as much CPU: SQLite
        // materialises its SELECT and its RETURNING rows in temporary tables and keeps a
        // statement journal for it, whose memory the allocator returns to the system after each.)
        let last =
            try lastSeq
            ?? connection.queryOne(
                "SELECT max(seq) FROM history WHERE run_id = ?1", [.integer(runID)], operation: operation,
                { $0.optionalInt64(0) ?? 0 }) ?? 0
        let seq = last + 1
        try connection.run(
            """
            INSERT INTO history (run_id, seq, kind, step, token, value, at, deadline_boot, deadline_uptime)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
            """,
            [
                .integer(runID), .integer(seq), .text(kind.rawValue), .optional(step), .optional(token),
                .optional(value), .integer(now), .optional(uptime == nil ? nil : clock.boot), .optional(uptime),
            ],
            operation: operation)
        if touchesRun {
            try connection.run(
                endsStep
                    ? "UPDATE runs SET current_step = NULL, current_token = NULL, updated_at = ?2 WHERE id = ?1"
                    : "UPDATE runs SET updated_at = ?2 WHERE id = ?1",
                [.integer(runID), .integer(now)], operation: operation)
        }
        return HistoryEntry(
            runID: runID, seq: seq, kind: kind, step: step, token: token, value: value, at: Clock.date(now))
    }

    /// Ends the run with `status`: no token, no wake-up, no owner.
    ///
    /// - Parameter endsStep: also clears the run's step, which an unhop earlier in this write
    ///   ended (``recordUnhop(token:output:then:runID:owner:)``).
    func setStatus(_ runID: Int64, _ status: RunStatus, endsStep: Bool = false, operation: String) throws {
        try connection.run(
            endsStep
                ? """
                UPDATE runs SET status = ?2, current_step = NULL, current_token = NULL, wake_on = NULL, wake_at = NULL, wake_boot = NULL, wake_uptime = NULL,
                    owner = NULL, lease_expires_at = NULL, updated_at = ?3
                WHERE id = ?1
                """
                : """
                UPDATE runs SET status = ?2, current_token = NULL, wake_on = NULL, wake_at = NULL, wake_boot = NULL, wake_uptime = NULL, owner = NULL,
                    lease_expires_at = NULL, updated_at = ?3
                WHERE id = ?1
                """,
            [.integer(runID), .text(status.rawValue), .integer(Clock.nowMilliseconds())], operation: operation)
    }

    func unfinishedRun(flow: String, subject: String, operation: String) throws -> RunRecord? {
        try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 AND status IN \(RunStatus.unfinishedSQL)",
            [.text(flow), .text(subject)], operation: operation, RunRecord.init(row:))
    }

    func insertRun(
        flow: String, subject: String, version: String, owner: String? = nil, until: Date? = nil, operation: String
    ) throws -> RunRecord {
        let now = Clock.nowMilliseconds()
        let lease = until.map(UptimeClock.machine.lease(until:))
        // A new run never takes the id of a run whose records were lost (see `Connection.runIDFloor`):
        // SQLite would otherwise hand the id of a rolled-back insert out again.
        try connection.run(
            """
            INSERT INTO runs (id, flow, subject, flow_version, status, created_at, updated_at, owner, last_owner,
                lease_expires_at, lease_boot)
            VALUES (
                CASE WHEN ?7 > 0 THEN max(?7, (SELECT coalesce(max(id), 0) + 1 FROM runs)) END,
                ?1, ?2, ?3, \(RunStatus.running.sql), ?4, ?4, ?5, ?5, ?6, ?8)
            """,
            [
                .text(flow), .text(subject), .text(version), .integer(now), owner.map(SQLValue.text) ?? .null,
                .optional(lease?.expiresAt), .integer(connection.runIDFloor),
                .optional(lease?.boot),
            ], operation: operation)
        return try requireRun(connection.lastInsertedRowID, operation: operation)
    }

    /// Checks run `runID`, when a steering command names it so that a retry changes nothing,
    /// against `current`, the run the command acts on (``StorageRules/checkNamedRun``): the
    /// named run is read only when it is another.
    func checkNamedRun(
        _ runID: Int64?, current: RunRecord?, flow: String, subject: String, verb: String, operation: String
    ) throws {
        guard let runID else { return }
        try StorageRules(location: path).checkNamedRun(
            runID, named: current?.id == runID ? current : try run(id: runID, operation: operation), current: current,
            flow: flow, subject: subject, verb: verb, operation: operation)
    }

    /// The newest run of `flow` for `subject`, finished or not.
    func latestRun(flow: String, subject: String, operation: String) throws -> RunRecord? {
        try queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
            [.text(flow), .text(subject)], operation: operation, RunRecord.init(row:))
    }

    /// The newest run of `flow` for `subject`, finished or not; `.notFound` without one.
    func requireLatestRun(flow: String, subject: String, operation: String) throws -> RunRecord {
        guard let latest = try latestRun(flow: flow, subject: subject, operation: operation) else {
            throw refuse(
                .notFound, operation, "there is no run of flow '\(flow)' for subject '\(subject)'",
                hint: "Check the names with `hopctl status`")
        }
        return latest
    }

    func run(id runID: Int64, operation: String) throws -> RunRecord? {
        try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE id = ?1", [.integer(runID)], operation: operation,
            RunRecord.init(row:))
    }

    func requireRun(_ runID: Int64, operation: String) throws -> RunRecord {
        guard let run = try run(id: runID, operation: operation) else {
            throw refuse(.notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
        }
        return run
    }

    /// What a write checks of run `runID` before it records: that the run is unfinished and,
    /// with `owner`, held by that engine; with `following`, that its history ends at that entry.
    /// Reads the few columns a check needs; the whole record only to explain a refusal.
    func requireUnfinished(
        _ runID: Int64, owner: String? = nil, following: Int64? = nil, operation: String
    ) throws -> RunHead {
        guard
            let head = try connection.queryOne(
                "SELECT \(RunHead.columns) FROM runs WHERE id = ?1", [.integer(runID)], operation: operation,
                RunHead.init(row:))
        else {
            throw refuse(.notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
        }
        // Fenced: an engine writes to a run only while it holds it. One that lost it (it was
        // frozen past its lease, another took over, the run parked) writes nothing more.
        guard head.status.isUnfinished, owner == nil || head.owner == owner else {
            let run = try requireRun(runID, operation: operation)
            guard run.status.isUnfinished else {
                throw refuse(
                    .refused, operation,
                    "run \(runID) of \(run.flow) for \(run.subject) is \(run.status.rawValue) and no longer advances",
                    hint: "Start it over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`")
            }
            let holder = run.owner.map { "another engine (\(Incarnation.label(of: $0)))" } ?? "no engine"
            throw refuse(
                .refused, operation, "run \(runID) is held by \(holder); this engine no longer executes it",
                hint: "Nothing to do: the engine that holds the run carries it on")
        }
        try StorageRules(location: path).checkFollows(
            runID: runID, last: head.lastSeq ?? 0, following: following, operation: operation)
        return head
    }

    func requireRunning(
        _ runID: Int64, owner: String? = nil, following: Int64? = nil, operation: String
    ) throws -> RunHead {
        let head = try requireUnfinished(runID, owner: owner, following: following, operation: operation)
        guard head.status == .running else {
            throw refuse(.refused, operation, "run \(runID) is \(head.status.rawValue)")
        }
        return head
    }

    func noUnfinishedRun(flow: String, subject: String, operation: String) -> HopError {
        refuse(
            .notFound, operation, "there is no unfinished run of flow '\(flow)' for subject '\(subject)'",
            hint: "Check the names with `hopctl status`")
    }
}

/// The columns of a run's row that a write checks before it records (``WriteTransaction/requireUnfinished(_:owner:operation:)``).
struct RunHead {
    let id: Int64
    let subject: String
    let status: RunStatus
    let owner: String?
    let currentStep: String?
    let currentToken: String?
    /// The number of the run's last history entry (0 for none), read with the check in the
    /// same statement, so that the write's entry is numbered without reading it again; `nil`
    /// when the head was made from a record that does not hold it.
    let lastSeq: Int64?

    /// `run` once an unhop numbered `seq` ended its step, before the row is updated.
    init(_ run: RunHead, endedAt seq: Int64) {
        id = run.id
        subject = run.subject
        status = run.status
        owner = run.owner
        currentStep = nil
        currentToken = nil
        lastSeq = seq
    }

    init(_ run: RunRecord) {
        id = run.id
        subject = run.subject
        status = run.status
        owner = run.owner
        currentStep = run.currentStep
        currentToken = run.currentToken
        lastSeq = nil
    }
}
