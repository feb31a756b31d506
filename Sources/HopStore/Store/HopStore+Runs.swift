import Foundation

extension HopStore {
    // MARK: Reading runs

    /// The run with `id`, if it exists.
    public func run(id: Int64) throws -> RunRecord? {
        try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE id = ?1", [.integer(id)], operation: "read run \(id)",
            RunRecord.init(row:))
    }

    /// The newest run of `flow` for `subject`, finished or not.
    public func latestRun(flow: String, subject: String) throws -> RunRecord? {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        return try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
            [.text(flow), .text(subject)], operation: "read latest run of \(flow) for \(subject)", RunRecord.init(row:))
    }

    /// The newest run of each (flow, subject), optionally narrowed to one flow or subject.
    public func runs(flow: String? = nil, subject: String? = nil, limit: Int = 1000) throws -> [RunRecord] {
        if let flow { try validate(flow, as: "flow name") }
        if let subject { try validate(subject, as: "subject") }
        // One statement per filter combination, so that SQLite can search the (flow, subject, id) index.
        let filter: String
        var arguments: [SQLValue] = []
        switch (flow, subject) {
        case let (flow?, subject?):
            filter = "WHERE flow = ?2 AND subject = ?3"
            arguments = [.text(flow), .text(subject)]
        case let (flow?, nil):
            filter = "WHERE flow = ?2"
            arguments = [.text(flow)]
        case let (nil, subject?):
            filter = "WHERE subject = ?2"
            arguments = [.text(subject)]
        case (nil, nil):
            filter = ""
        }
        return try connection.query(
            """
            SELECT \(RunRecord.columns) FROM runs
            WHERE id IN (SELECT max(id) FROM runs \(filter) GROUP BY flow, subject)
            ORDER BY flow, subject LIMIT ?1
            """,
            [.integer(Int64(limit))] + arguments, operation: "list runs", RunRecord.init(row:))
    }

    /// The names of the flows that have runs here, in order.
    public func flowNames() throws -> [String] {
        try connection.query("SELECT DISTINCT flow FROM runs ORDER BY flow", [], operation: "list flows") { $0.text(0) }
    }

    /// Every run of `flow` for `subject`, oldest first.
    public func allRuns(flow: String, subject: String) throws -> [RunRecord] {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        return try connection.query(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id",
            [.text(flow), .text(subject)], operation: "list runs of \(flow) for \(subject)", RunRecord.init(row:))
    }

    /// Unfinished runs with `status` whose flow is one of `flows`, oldest first.
    public func unfinishedRuns(status: RunStatus, flows: [String]) throws -> [RunRecord] {
        guard status.isUnfinished else { return [] }
        var runs: [RunRecord] = []
        for flow in flows {
            runs += try connection.query(
                "SELECT \(RunRecord.columns) FROM runs WHERE status = ?1 AND flow = ?2 ORDER BY id",
                [.text(status.rawValue), .text(flow)], operation: "list \(status.rawValue) runs of \(flow)",
                RunRecord.init(row:))
        }
        return runs.sorted { $0.id < $1.id }
    }

    /// The history of run `runID` in order; with `limit`, its last `limit` entries.
    public func history(runID: Int64, limit: Int? = nil) throws -> [HistoryEvent] {
        if let limit {
            return try connection.query(
                "SELECT * FROM (SELECT \(HistoryEvent.columns) FROM history WHERE run_id = ?1 ORDER BY seq DESC LIMIT ?2) ORDER BY seq",
                [.integer(runID), .integer(Int64(limit))], operation: "read history of run \(runID)", HistoryEvent.init(row:))
        }
        return try connection.query(
            "SELECT \(HistoryEvent.columns) FROM history WHERE run_id = ?1 ORDER BY seq",
            [.integer(runID)], operation: "read history of run \(runID)", HistoryEvent.init(row:))
    }

    /// The histories of `runIDs`, each in order, read in one statement (for an engine resuming many runs).
    public func histories(runIDs: [Int64]) throws -> [Int64: [HistoryEvent]] {
        guard !runIDs.isEmpty else { return [:] }
        let list = Self.jsonList(runIDs)
        var histories: [Int64: [HistoryEvent]] = [:]
        histories.reserveCapacity(runIDs.count)
        for event in try connection.query(
            "SELECT \(HistoryEvent.columns) FROM history WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq",
            [.text(list)], operation: "read the histories of \(runIDs.count) runs", HistoryEvent.init(row:))
        {
            histories[event.runID, default: []].append(event)
        }
        return histories
    }

    /// The hops observed in all runs of `flow`: each edge from one entered step to the next, with its count.
    public func hopGraph(flow: String) throws -> [HopEdge] {
        try validate(flow, as: "flow name")
        return try connection.query(
            """
            SELECT prev, step, count(*) FROM (
                SELECT h.step AS step, lag(h.step) OVER (PARTITION BY h.run_id ORDER BY h.seq) AS prev
                FROM runs r JOIN history h ON h.run_id = r.id
                WHERE r.flow = ?1 AND h.kind = 'hop')
            GROUP BY prev, step ORDER BY count(*) DESC, prev, step
            """,
            [.text(flow)], operation: "read hop graph of \(flow)"
        ) { HopEdge(from: $0.optionalText(0), to: $0.text(1), count: Int($0.int64(2))) }
    }

    // MARK: Starting, ending and restarting runs

    /// Starts a run of `flow` for `subject`, or returns the unfinished one (at most one exists).
    public func startRun(flow: String, subject: String, version: String) async throws -> (run: RunRecord, created: Bool) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(version, as: "flow version")
        let operation = "start run of \(flow) for \(subject)"
        return try await transaction(operation) { [self] in
            if let existing = try unfinishedRunLocked(flow: flow, subject: subject, operation: operation) {
                return (existing, false)
            }
            return (try insertRunLocked(flow: flow, subject: subject, version: version, operation: operation), true)
        }
    }

    /// Cancels the unfinished run of `flow` for `subject`: it never advances again. History is kept.
    /// - Throws: `.notFound` when the subject has no unfinished run of the flow.
    @discardableResult
    public func cancelRun(flow: String, subject: String, reason: String = "cancelled") async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        let operation = "cancel \(flow) for \(subject)"
        return try await transaction(operation) { [self] in
            guard let run = try unfinishedRunLocked(flow: flow, subject: subject, operation: operation) else {
                throw noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            try append(runID: run.id, .cancel, step: run.currentStep, value: reason, operation: operation)
            try setStatus(run.id, .cancelled, operation: operation)
            return try requireRun(run.id, operation: operation)
        }
    }

    /// Ends the latest run of `flow` for `subject` (cancelling it when unfinished) and creates a
    /// new run that starts from the beginning the next time an engine runs the flow.
    /// The old run's history is kept.
    @discardableResult
    public func restartRun(flow: String, subject: String) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        let operation = "restart \(flow) for \(subject)"
        return try await transaction(operation) { [self] in
            guard let latest = try connection.queryOne(
                "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 ORDER BY id DESC LIMIT 1",
                [.text(flow), .text(subject)], operation: operation, RunRecord.init(row:))
            else {
                throw refuse(
                    .notFound, operation, "there is no run of flow '\(flow)' for subject '\(subject)'",
                    hint: "Check the names with `hopctl status`")
            }
            if latest.status.isUnfinished {
                try append(runID: latest.id, .restart, step: latest.currentStep, value: "restarted", operation: operation)
                try setStatus(latest.id, .cancelled, operation: operation)
            }
            return try insertRunLocked(flow: flow, subject: subject, version: latest.flowVersion, operation: operation)
        }
    }

    // MARK: Recording what a run does

    /// Records that run `runID` entered `step`, after an optional transition from `from`, and
    /// returns the hop entry with its fresh token. A parking step leaves the run `parked` and
    /// releases its lease; with a `deadline`, the step times out then (stored with the hop).
    ///
    /// - Parameter owner: the engine executing the run; the hop is refused when another engine holds it.
    @discardableResult
    public func recordHop(
        runID: Int64, step: String, from: String? = nil, parks: Bool = false, wakeOn: WakeCondition? = nil,
        deadline: Date? = nil, owner: String? = nil
    ) async throws -> HistoryEvent {
        try validate(step, as: "step name")
        let operation = "hop run \(runID) to \(step)"
        return try await transaction(operation) { [self] in
            let run = try requireRunning(runID, owner: owner, operation: operation)
            if let inFlight = run.currentStep, run.currentToken != nil {
                throw refuse(.refused, operation, "step '\(inFlight)' is still in flight; it must unhop first")
            }
            if let from {
                try append(runID: runID, .transition, step: step, value: from, operation: operation)
            }
            let token = Token.random()
            let deadlineValue = deadline.map { #"{"deadline":\#(Clock.milliseconds($0))}"# }
            let event = try append(runID: runID, .hop, step: step, token: token, value: deadlineValue, touchesRun: false, operation: operation)
            try connection.run(
                """
                UPDATE runs SET current_step = ?2, current_token = ?3, status = ?4, wake_on = ?5, wake_at = ?6,
                    owner = CASE WHEN ?7 THEN NULL ELSE owner END,
                    lease_expires_at = CASE WHEN ?7 THEN NULL ELSE lease_expires_at END,
                    updated_at = ?8
                WHERE id = ?1
                """,
                [.integer(runID), .text(step), .text(token), .text(parks ? RunStatus.parked.rawValue : RunStatus.running.rawValue),
                 .optional(parks ? wakeOn?.rawValue : nil), .optional(parks ? deadline.map(Clock.milliseconds) : nil),
                 .integer(parks ? 1 : 0), .integer(Clock.nowMilliseconds())],
                operation: operation)
            if parks, let wakeOn { try endIfAlreadyWokenLocked(runID: runID, wakeOn: wakeOn, operation: operation) }
            return event
        }
    }

    /// A step that parks until a stored change, whose change has already happened when it parks,
    /// ends at once in the same transaction, as the change would have ended it: a login step
    /// entered after the session was stored (a login that raced the hop) is unhopped, a step that
    /// lasts while a session is stored is re-routed when none is. Otherwise it would wait for a
    /// change that already came.
    private func endIfAlreadyWokenLocked(runID: Int64, wakeOn: WakeCondition, operation: String) throws {
        let subject = try requireRun(runID, operation: operation).subject
        let stored = try session(subject: subject)
        switch (wakeOn, stored) {
        case (.sessionStored, let stored?):
            try unhopLoginStepsLocked(subject: subject, userID: stored.userID, operation: operation)
        case (.sessionRemoved, nil):
            try rerouteSessionStepsLocked(subject: subject, reason: "session-removed", operation: operation)
        default:
            break
        }
    }

    /// Finishes the step in flight of run `runID`, exactly once.
    ///
    /// - Parameters:
    ///   - output: the step's output as JSON text, or `nil`.
    ///   - owner: the engine executing the run (for an in-process step); `nil` for an unhop from outside.
    /// - Throws: `.refused`, changing nothing, when the token is stale or unknown, the step
    ///   already unhopped, or the run is finished; `.invalidInput` when `output` is not JSON.
    @discardableResult
    public func recordUnhop(runID: Int64, token: String, output: String? = nil, owner: String? = nil) async throws -> HistoryEvent {
        let operation = "unhop run \(runID)"
        if let output { try JSONText.validate(output, as: "step output", path: path) }
        return try await transaction(operation) { [self] in
            let run = try requireUnfinished(runID, owner: owner, operation: operation)
            return try endStepLocked(run, token: token, kind: .unhop, value: output, operation: operation)
        }
    }

    /// Ends the step in flight of run `runID` because its deadline passed, exactly once
    /// (a racing unhop and timeout: the first to commit wins, the other is refused).
    @discardableResult
    public func recordTimeout(runID: Int64, token: String, owner: String? = nil) async throws -> HistoryEvent {
        let operation = "time out run \(runID)"
        return try await transaction(operation) { [self] in
            let run = try requireUnfinished(runID, owner: owner, operation: operation)
            return try endStepLocked(run, token: token, kind: .timeout, value: nil, operation: operation)
        }
    }

    /// Finishes `step`, on which the unfinished run of `flow` for `subject` is parked (as
    /// `hopctl unhop` does), exactly once. Addressed by step, so a retried command never
    /// finishes the step after it.
    /// - Throws: `.notFound` without an unfinished run; `.refused`, changing nothing, when the run
    ///   is not parked on `step`, or when `step` is finished by a stored session (a login step).
    public func unhopParked(flow: String, subject: String, step: String, output: String? = nil) async throws -> (run: RunRecord, unhop: HistoryEvent) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(step, as: "step name")
        let operation = "unhop \(step) of \(flow) for \(subject)"
        if let output { try JSONText.validate(output, as: "step output", path: path) }
        return try await transaction(operation) { [self] in
            guard let run = try unfinishedRunLocked(flow: flow, subject: subject, operation: operation) else {
                throw noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
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
                    .refused, operation, "step '\(step)' of run \(run.id) finishes when a session is stored, not by hand; nothing was changed",
                    hint: "Log the user in: `hopctl session login USER --subject \(subject)`")
            }
            let event = try endStepLocked(run, token: token, kind: .unhop, value: output, operation: operation)
            return (try requireRun(run.id, operation: operation), event)
        }
    }

    /// Records the value a condition had when the run read it; replay returns it again.
    @discardableResult
    public func recordDecision(runID: Int64, name: String, value: String, owner: String? = nil) async throws -> HistoryEvent {
        try validate(name, as: "decision name")
        try JSONText.validate(value, as: "decision value", path: path)
        let operation = "record decision \(name) of run \(runID)"
        return try await transaction(operation) { [self] in
            _ = try requireRunning(runID, owner: owner, operation: operation)
            return try append(runID: runID, .decision, step: name, value: value, operation: operation)
        }
    }

    /// Records a durable sleep of run `runID` until `deadline`; replay sleeps until the same deadline.
    @discardableResult
    public func recordTimer(runID: Int64, name: String, deadline: Date, owner: String? = nil) async throws -> HistoryEvent {
        try validate(name, as: "timer name")
        let operation = "record timer \(name) of run \(runID)"
        return try await transaction(operation) { [self] in
            _ = try requireRunning(runID, owner: owner, operation: operation)
            return try append(runID: runID, .timer, step: name, value: "\(Clock.milliseconds(deadline))", operation: operation)
        }
    }

    /// Marks `feature` used by the run's subject and records it in the run's history, in one transaction.
    @discardableResult
    public func markUsed(runID: Int64, feature: String, owner: String? = nil) async throws -> HistoryEvent {
        try validate(feature, as: "feature name")
        let operation = "mark \(feature) used by run \(runID)"
        return try await transaction(operation) { [self] in
            let run = try requireRunning(runID, owner: owner, operation: operation)
            try connection.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                [.text(run.subject), .text(feature), .integer(Clock.nowMilliseconds())], operation: operation)
            return try append(runID: runID, .effect, step: Self.markUsedEffect(feature), operation: operation)
        }
    }

    /// The history name of the effect that marks `feature` used.
    public static func markUsedEffect(_ feature: String) -> String { "markUsed(\(feature))" }

    /// Records that `step` threw. With `final`, the run is marked failed.
    @discardableResult
    public func recordError(runID: Int64, step: String?, message: String, final: Bool, owner: String? = nil) async throws -> HistoryEvent {
        let operation = "record error of run \(runID)"
        return try await transaction(operation) { [self] in
            _ = try requireUnfinished(runID, owner: owner, operation: operation)
            let event = try append(runID: runID, final ? .fail : .error, step: step, value: message, operation: operation)
            if final { try setStatus(runID, .failed, operation: operation) }
            return event
        }
    }

    /// Records that the flow body of run `runID` returned: the run is completed.
    @discardableResult
    public func completeRun(runID: Int64, owner: String? = nil) async throws -> HistoryEvent {
        let operation = "complete run \(runID)"
        return try await transaction(operation) { [self] in
            _ = try requireRunning(runID, owner: owner, operation: operation)
            let event = try append(runID: runID, .complete, operation: operation)
            try setStatus(runID, .completed, operation: operation)
            return event
        }
    }

    /// Marks run `runID` diverged: the flow code asked for another path than its history.
    @discardableResult
    public func divergeRun(runID: Int64, step: String?, message: String, owner: String? = nil) async throws -> HistoryEvent {
        let operation = "mark run \(runID) diverged"
        return try await transaction(operation) { [self] in
            _ = try requireUnfinished(runID, owner: owner, operation: operation)
            let event = try append(runID: runID, .diverge, step: step, value: message, operation: operation)
            try setStatus(runID, .diverged, operation: operation)
            return event
        }
    }

    // MARK: Inside a transaction

    /// Ends the step in flight of `run` with an unhop, a timeout or a re-route, if `token` is its token.
    @discardableResult
    func endStepLocked(_ run: RunRecord, token: String, kind: HistoryKind, value: String?, operation: String) throws -> HistoryEvent {
        guard let step = run.currentStep, let current = run.currentToken, current == token else {
            let earlier = try connection.queryOne(
                "SELECT step, kind FROM history WHERE run_id = ?1 AND kind IN ('unhop', 'timeout', 'reroute') AND token = ?2",
                [.integer(run.id), .text(token)], operation: operation) { ($0.text(0), $0.text(1)) }
            if let earlier {
                let how = earlier.1 == "unhop" ? "has already unhopped" : "has already ended (\(earlier.1))"
                throw refuse(.refused, operation, "step '\(earlier.0)' of run \(run.id) \(how); a hop ends once")
            }
            if run.currentToken == nil {
                throw refuse(.refused, operation, "run \(run.id) has no step in flight")
            }
            throw refuse(
                .refused, operation, "the token is stale or unknown: it is not the token of step '\(run.currentStep ?? "?")' in flight",
                hint: "Read the current token again (`hopctl status`) and retry")
        }
        let event = try append(runID: run.id, kind, step: step, token: token, value: value, touchesRun: false, operation: operation)
        try connection.run(
            """
            UPDATE runs SET current_step = NULL, current_token = NULL, wake_on = NULL, wake_at = NULL, status = 'running',
                updated_at = ?2
            WHERE id = ?1
            """,
            [.integer(run.id), .integer(Clock.nowMilliseconds())], operation: operation)
        return event
    }

    /// Appends one history entry to run `runID` and, unless the caller updates the run's row
    /// itself (`touchesRun: false`), its `updated_at`.
    @discardableResult
    func append(
        runID: Int64, _ kind: HistoryKind, step: String? = nil, token: String? = nil, value: String? = nil,
        touchesRun: Bool = true, operation: String
    ) throws -> HistoryEvent {
        let now = Clock.nowMilliseconds()
        let seq = (try connection.queryOne(
            "SELECT max(seq) FROM history WHERE run_id = ?1", [.integer(runID)], operation: operation) { $0.optionalInt64(0) } ?? nil) ?? 0
        try connection.run(
            "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            [.integer(runID), .integer(seq + 1), .text(kind.rawValue), .optional(step), .optional(token), .optional(value), .integer(now)],
            operation: operation)
        if touchesRun {
            try connection.run("UPDATE runs SET updated_at = ?2 WHERE id = ?1", [.integer(runID), .integer(now)], operation: operation)
        }
        return HistoryEvent(runID: runID, seq: seq + 1, kind: kind, step: step, token: token, value: value, at: Clock.date(now))
    }

    /// Ends the run with `status`: no token, no wake-up, no owner.
    func setStatus(_ runID: Int64, _ status: RunStatus, operation: String) throws {
        try connection.run(
            """
            UPDATE runs SET status = ?2, current_token = NULL, wake_on = NULL, wake_at = NULL, owner = NULL,
                lease_expires_at = NULL, updated_at = ?3
            WHERE id = ?1
            """,
            [.integer(runID), .text(status.rawValue), .integer(Clock.nowMilliseconds())], operation: operation)
    }

    func unfinishedRunLocked(flow: String, subject: String, operation: String) throws -> RunRecord? {
        try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE flow = ?1 AND subject = ?2 AND status IN ('running', 'parked')",
            [.text(flow), .text(subject)], operation: operation, RunRecord.init(row:))
    }

    private func insertRunLocked(flow: String, subject: String, version: String, operation: String) throws -> RunRecord {
        let now = Clock.nowMilliseconds()
        try connection.run(
            """
            INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
            VALUES (?1, ?2, ?3, 'running', ?4, ?4)
            """,
            [.text(flow), .text(subject), .text(version), .integer(now)], operation: operation)
        return try requireRun(connection.lastInsertedRowID, operation: operation)
    }

    func requireRun(_ runID: Int64, operation: String) throws -> RunRecord {
        guard let run = try connection.queryOne(
            "SELECT \(RunRecord.columns) FROM runs WHERE id = ?1", [.integer(runID)], operation: operation, RunRecord.init(row:))
        else {
            throw refuse(.notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
        }
        return run
    }

    private func requireUnfinished(_ runID: Int64, owner: String? = nil, operation: String) throws -> RunRecord {
        let run = try requireRun(runID, operation: operation)
        guard run.status.isUnfinished else {
            throw refuse(
                .refused, operation, "run \(runID) of \(run.flow) for \(run.subject) is \(run.status.rawValue) and no longer advances",
                hint: "Start it over with `hopctl restart --flow \(run.flow) --subject \(run.subject)`")
        }
        // Fenced: an engine writes to a run only while it holds it. One that lost it (it was
        // frozen past its lease, another took over, the run parked) writes nothing more.
        if let owner, run.owner != owner {
            let holder = run.owner.map { "another engine (\(Incarnation.label(of: $0)))" } ?? "no engine"
            throw refuse(
                .refused, operation, "run \(runID) is held by \(holder); this engine no longer executes it",
                hint: "Nothing to do: the engine that holds the run carries it on")
        }
        return run
    }

    private func requireRunning(_ runID: Int64, owner: String? = nil, operation: String) throws -> RunRecord {
        let run = try requireUnfinished(runID, owner: owner, operation: operation)
        guard run.status == .running else {
            throw refuse(.refused, operation, "run \(runID) is \(run.status.rawValue)")
        }
        return run
    }

    private func noUnfinishedRun(flow: String, subject: String, operation: String) -> HopStoreError {
        refuse(
            .notFound, operation, "there is no unfinished run of flow '\(flow)' for subject '\(subject)'",
            hint: "Check the names with `hopctl status`")
    }
}
