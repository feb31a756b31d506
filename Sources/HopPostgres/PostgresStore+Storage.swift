import Foundation
import HopStore
import PostgresNIO

/// The storage seam on PostgreSQL: every operation an engine needs, with the semantics of the
/// SQLite store (see `HopStorage`), each mutation one transaction.
extension PostgresStore: HopStorage {
    package var location: String { url.redacted }

    // MARK: Liveness and change notification

    package func makeIncarnation(label: String) -> Incarnation {
        let id = Incarnation.makeID(label: label)
        // makeID ends every id in '#' and 16 hex digits, whose 64 bits are the lock's key.
        let lock = AdvisoryLock(key: AdvisoryLock.key(ofOwner: id) ?? 0, url: url, logger: logger)
        locks.withLock { locks in
            locks = locks.filter { $0.value.lock != nil }
            locks[id] = WeakLock(lock: lock)
        }
        return Incarnation(label: label, id: id, serverLock: lock)
    }

    /// Waits until `owner`'s liveness lock is held, when the incarnation was made here: a run is
    /// never recorded as held by an owner that other engines could not prove alive. A wait that
    /// its task's cancellation ends throws a ``HopError`` that says so, as a cancelled query does.
    func ensureLiveness(of owner: String?) async throws {
        guard let owner, let lock = locks.withLock({ $0[owner]?.lock }) else { return }
        do {
            try await lock.held()
        } catch let error as CancellationError {
            throw map(error, operation: "wait for this engine's liveness lock")
        }
    }

    /// Throws `.replaced` once a statement of this store found the database replaced
    /// (``checkNotReplaced(runsTable:operation:)``).
    package func changeVersion() async throws -> Int64 {
        if replaced.load(ordering: .relaxed) { throw replacedError(operation: "watch the database") }
        return changes.current
    }

    /// Also looks whether the database is still the one this store opened
    /// (``checkNotReplaced(runsTable:operation:)``): an engine whose runs are all parked writes
    /// nothing that would find it, and its watch looks here every third of a lease.
    package func checkSchema() async throws {
        let operation = "check the schema"
        let found = try await readOne(
            "SELECT version::bigint, name, \(Self.runsTableNow) FROM hop_migrations ORDER BY version DESC LIMIT 1", [],
            operation: operation
        ) { (newest: (version: Int(try $0.int64(0)), name: try $0.text(1)), table: try $0.int64(2)) }
        // An upgrade first: a newer migration may create the table again.
        try StorageRules(location: location).checkNotUpgraded(newest: found?.newest, opened: schemaVersion)
        try checkNotReplaced(runsTable: found?.table ?? runsTable, operation: operation)
    }

    // MARK: Durability

    /// Flow bodies run on the cooperative pool: the store's work is network I/O on NIO's event loops.
    package var flowExecutor: (any TaskExecutor)? { nil }

    /// Nothing waits to be committed: every write commits before it returns.
    package func makeDurable() async throws {}

    package func waitUntilDurable(runID: Int64) async throws {}

    // MARK: Run lifecycle

    package func startRun(
        flow: String, subject: String, version: String, owner: String?, until: Date?, durability: WriteDurability
    ) async throws -> (run: RunRecord, created: Bool) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(version, as: "flow version")
        let lease = until.map(leaseLength(until:))  // before any wait (see `leaseLength(until:)`)
        try await ensureLiveness(of: owner)
        return try await transaction("start run of \(flow) for \(subject)") { tx in
            if let existing = try await tx.unfinishedRun(flow: flow, subject: subject) { return (existing, false) }
            let run = try await tx.insertRun(flow: flow, subject: subject, version: version, owner: owner, lease: lease)
            if owner == nil { try await tx.notifyChange() }
            return (run, true)
        }
    }

    @discardableResult
    package func cancelRun(flow: String, subject: String, runID: Int64?, reason: String) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        let operation = "cancel \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let unfinished = try await tx.unfinishedRun(flow: flow, subject: subject)
            try await tx.checkNamedRun(
                runID, current: unfinished, flow: flow, subject: subject, verb: "cancel", operation: operation)
            guard let run = unfinished else {
                throw tx.noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            try await tx.append(runID: run.id, .cancel, step: run.currentStep, value: reason)
            try await tx.setStatus(run.id, .cancelled)
            try await tx.notifyChange()
            return try await tx.requireRun(run.id, operation: operation)
        }
    }

    @discardableResult
    package func startNewRun(
        flow: String, subject: String, version: String?, allowingNewFlow: Bool, latest: ExpectedLatestRun?
    ) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "start \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let rules = StorageRules(location: tx.location)
            if let latest {
                try rules.checkLatest(
                    latest, latest: try await tx.latestRun(flow: flow, subject: subject), flow: flow, subject: subject,
                    operation: operation)
            }
            if let existing = try await tx.unfinishedRun(flow: flow, subject: subject) {
                throw rules.alreadyUnfinished(existing, operation: operation)
            }
            let newest = try await tx.queryOne(
                "SELECT flow_version FROM runs WHERE flow = $1 ORDER BY id DESC LIMIT 1", [.text(flow)]
            ) { try $0.text(0) }
            let known =
                StorageRules.needsKnownFlows(newest: newest, allowingNewFlow: allowingNewFlow)
                ? try await tx.query("SELECT DISTINCT flow FROM runs ORDER BY flow", []) { try $0.text(0) } : []
            let chosen = try rules.versionForNewRun(
                flow: flow, version: version, newest: newest, allowingNewFlow: allowingNewFlow, known: known,
                operation: operation)
            let run = try await tx.insertRun(flow: flow, subject: subject, version: chosen)
            try await tx.notifyChange()
            return run
        }
    }

    package func prune(_ pruning: Pruning, dryRun: Bool) async throws -> PruneReport {
        if let flow = pruning.flow { try validate(flow, as: "flow name") }
        let operation = "prune runs finished before \(pruning.finishedBefore.formatted(.iso8601))"
        // The server's autovacuum reclaims the space of deleted rows for new ones.
        var report = PruneReport(
            runs: 0, historyEntries: 0, batches: 0, reclaimedBytes: 0, reclaimsIncrementally: false)
        // A dry run looks as a prune does, and counts all each look finds.
        let batchSize = dryRun ? Int.max : max(1, pruning.batchSize)
        let span = Int64(max(1, pruning.scanSpan))
        let cutoff = PostgresValue.int(Clock.milliseconds(pruning.finishedBefore))
        var kept = try KeptRuns(keepLast: pruning.keepLast)
        // The runs in order of id, `scanSpan` at a time (as on SQLite): no statement reads every
        // run, none reads again the runs an earlier one passed over, and only a batch's removal
        // is a transaction. Each subject's `keepLast`-th newest run is read once (`KeptRuns`).
        let first = try await readOne("SELECT min(id) - 1 FROM runs", operation: operation) {
            try $0.optionalInt64(0)
        }
        try await Pruning.look(after: first ?? nil, into: &report) { start in
            guard
                let end = try await readOne(
                    "SELECT max(id) FROM (SELECT id FROM runs WHERE id > $1 ORDER BY id LIMIT $2) AS look",
                    [.int(start), .int(span)], operation: operation, { try $0.optionalInt64(0) }) ?? nil
            else { return .done }
            // Never the run with the highest id, so that no id is ever used twice.
            let candidates = try await read(
                """
                SELECT id, flow, subject FROM runs
                WHERE id > $1 AND id <= $2 AND status NOT IN \(RunStatus.pgUnfinished) AND updated_at < $3
                    AND ($4::text IS NULL OR flow = $4) AND id < (SELECT max(id) FROM runs)
                ORDER BY id
                """, [.int(start), .int(end), cutoff, .optional(pruning.flow)], operation: operation
            ) { (id: try $0.int64(0), flow: try $0.text(1), subject: try $0.text(2)) }
            var ids: [Int64] = []
            for run in candidates where ids.count < batchSize {
                let lowest = try await kept.lowest(flow: run.flow, subject: run.subject) { flow, subject, offset in
                    try await self.readOne(
                        "SELECT id FROM runs WHERE flow = $1 AND subject = $2 ORDER BY id DESC LIMIT 1 OFFSET $3",
                        [.text(flow), .text(subject), .int(offset)], operation: operation
                    ) { try $0.int64(0) }
                }
                if run.id < lowest { ids.append(run.id) }
            }
            let found = Pruning.Look(found: ids, batchSize: Int64(batchSize), end: end)
            guard !ids.isEmpty else { return found }
            if dryRun {
                let entries = try await readOne(
                    "SELECT count(*) FROM history WHERE run_id = ANY($1)", [.ints(ids)], operation: operation
                ) { Int(try $0.int64(0)) }
                return found.removed(runs: ids.count, entries: entries ?? 0)
            }
            // Each run checked again (a fork may have written to it since the look read it, or
            // another engine's prune removed it); the history goes with its run (ON DELETE
            // CASCADE), counted from the statement's snapshot, from before the removal.
            let batch = ids
            let removed = try await transaction(operation) { tx in
                try await tx.queryOne(
                    """
                    WITH gone AS (
                        DELETE FROM runs WHERE id = ANY($1) AND status NOT IN \(RunStatus.pgUnfinished) AND updated_at < $2
                        RETURNING id)
                    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM history WHERE run_id IN (SELECT id FROM gone))
                    """, [.ints(batch), cutoff]
                ) { (runs: Int(try $0.int64(0)), entries: Int(try $0.int64(1))) }
            }
            return found.removed(runs: removed?.runs ?? 0, entries: removed?.entries ?? 0)
        }
        if dryRun { report.batches = 0 }
        return report
    }

    @discardableResult
    package func restartRun(flow: String, subject: String, runID: Int64?, version: String?) async throws -> RunRecord {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "restart \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let latest = try await tx.requireLatestRun(flow: flow, subject: subject, operation: operation)
            try await tx.checkNamedRun(
                runID, current: latest, flow: flow, subject: subject, verb: "restart", operation: operation)
            if latest.status.isUnfinished {
                try await tx.append(runID: latest.id, .restart, step: latest.currentStep, value: "restarted")
                try await tx.setStatus(latest.id, .cancelled)
            }
            let run = try await tx.insertRun(flow: flow, subject: subject, version: version ?? latest.flowVersion)
            try await tx.notifyChange()
            return run
        }
    }

    package func forkRun(
        flow: String, subject: String, runID: Int64?, through seq: Int64, version: String?
    ) async throws -> (old: RunRecord, new: RunRecord) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        if let version { try validate(version, as: "flow version") }
        let operation = "fork \(flow) for \(subject)"
        return try await transaction(operation) { tx in
            let old: RunRecord
            if let runID {
                guard let found = try await tx.run(id: runID, locking: true) else {
                    throw tx.refuse(
                        .notFound, operation, "run \(runID) does not exist", hint: "List runs with `hopctl status`")
                }
                guard found.flow == flow, found.subject == subject else {
                    throw tx.refuse(
                        .notFound, operation,
                        "run \(runID) belongs to flow '\(found.flow)' for subject '\(found.subject)', not '\(flow)' for '\(subject)'",
                        hint: "Pass the matching --flow and --subject")
                }
                old = found
            } else {
                old = try await tx.requireLatestRun(flow: flow, subject: subject, operation: operation)
            }
            let rules = StorageRules(location: tx.location)
            if let other = try await tx.unfinishedRun(flow: flow, subject: subject), other.id != old.id {
                throw rules.otherRunUnfinished(other, operation: operation)
            }
            try rules.checkFork(
                of: old, at: try await tx.forkPoint(of: old.id, through: seq), through: seq, operation: operation)
            if old.status.isUnfinished { try await tx.setStatus(old.id, .cancelled) }
            let new = try await tx.insertRun(flow: flow, subject: subject, version: version ?? old.flowVersion)
            let link = try await tx.append(runID: new.id, .fork, value: #"{"from":\#(old.id),"through":\#(seq)}"#)
            // The entries taken follow the link, numbered on from it and dated with it, in one
            // statement that never brings them to this process; the new run's row is not updated
            // for them (once per entry in one transaction, each update walks the versions the
            // ones before it left: a fork of 20,000 entries took 18 s).
            try await tx.run(
                """
                INSERT INTO history (run_id, seq, kind, step, token, value, at)
                SELECT $1, $2 + row_number() OVER (ORDER BY seq), kind, step, token, value, $3
                FROM history WHERE run_id = $4 AND seq <= $5 AND kind IN \(HistoryKind.pgReplayed)
                """, [.int(new.id), .int(link.seq), .int(Clock.milliseconds(link.at)), .int(old.id), .int(seq)])
            try await tx.append(runID: old.id, .fork, value: #"{"to":\#(new.id),"through":\#(seq)}"#)
            try await tx.notifyChange()
            return (
                try await tx.requireRun(old.id, operation: operation),
                try await tx.requireRun(new.id, operation: operation)
            )
        }
    }

    @discardableResult
    package func divergeRun(
        runID: Int64, step: String?, message: String, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        let operation = "mark run \(runID) diverged"
        return try await transaction(operation) { tx in
            _ = try await tx.requireUnfinished(runID, owner: owner, following: following, operation: operation)
            let event = try await tx.append(runID: runID, .diverge, step: step, value: message)
            try await tx.setStatus(runID, .diverged)
            if owner == nil { try await tx.notifyChange() }
            return event
        }
    }

    // MARK: Recording what a run does

    @discardableResult
    package func record(
        _ writes: [RunWrite], runID: Int64, owner: String?, following: Int64?, durability: WriteDurability
    ) async throws -> [HistoryEntry] {
        for write in writes { try write.validate(path: location) }
        let operation =
            writes.count == 1 ? writes[0].operation(runID: runID) : "record \(writes.count) entries of run \(runID)"
        // Once the transaction is over: a park with a deadline comes due then (``DueLook``).
        defer { if writes.contains(where: \.parksWithADeadline) { dueWritten() } }
        return try await transaction(operation) { tx in
            // Before any row of the run: a park until a login or logout is ordered with those.
            if writes.contains(where: \.parksUntilASessionChange) { try await tx.lockSubject(ofRun: runID) }
            var entries: [HistoryEntry] = []
            // Only the first follows the writer's last entry; each later one follows the one before.
            for (index, write) in writes.enumerated() {
                entries.append(
                    try await tx.record(write, runID: runID, owner: owner, following: index == 0 ? following : nil))
            }
            if owner == nil { try await tx.notifyChange() }
            return entries
        }
    }

    @discardableResult
    package func recordTimeout(runID: Int64, token: String, owner: String?) async throws -> HistoryEntry {
        let operation = "time out run \(runID)"
        return try await transaction(operation) { tx in
            let run = try await tx.requireUnfinished(runID, owner: owner, operation: operation)
            let entry = try await tx.endStep(run, token: token, kind: .timeout, value: nil, operation: operation)
            try await tx.notifyChange()
            return entry
        }
    }

    package func unhopParked(
        flow: String, subject: String, step: String, runID: Int64?, entry: Int64?, output: String?
    ) async throws -> (run: RunRecord, unhop: HistoryEntry) {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        try validate(step, as: "step name")
        let operation = "unhop \(step) of \(flow) for \(subject)"
        if let output { try JSONText.validate(output, as: "step output", path: location) }
        let rules = StorageRules(location: location)
        try rules.checkEntryNamesItsRun(entry: entry, runID: runID, operation: operation)
        return try await transaction(operation) { tx in
            let unfinished = try await tx.unfinishedRun(flow: flow, subject: subject)
            try await tx.checkNamedRun(
                runID, current: unfinished, flow: flow, subject: subject, verb: "unhop", operation: operation)
            guard let run = unfinished else {
                throw tx.noUnfinishedRun(flow: flow, subject: subject, operation: operation)
            }
            if let entry {
                // The statement of HopStore's `unhopParked`.
                let named = try await tx.queryOne(
                    """
                    SELECT h.step, h.kind, h.token,
                        (SELECT e.kind FROM history e
                            WHERE e.run_id = h.run_id AND e.kind IN \(HistoryKind.pgStepEnds) AND e.token = h.token),
                        (SELECT c.seq FROM runs r JOIN history c ON c.run_id = r.id AND c.token = r.current_token
                            WHERE r.id = h.run_id AND c.kind = 'hop')
                    FROM history h WHERE h.run_id = $1 AND h.seq = $2
                    """, [.int(run.id), .int(entry)]
                ) { row in
                    (
                        hop: (step: try row.optionalText(0), kind: try row.text(1), token: try row.optionalText(2)),
                        ending: try row.optionalText(3), current: try row.optionalInt64(4)
                    )
                }
                try rules.checkNamedEntry(
                    entry, of: run, step: step, hop: named?.hop, ending: named?.ending, current: named?.current,
                    operation: operation)
            }
            let token = try rules.tokenToUnhop(run, step: step, operation: operation)
            let event = try await tx.endStep(run, token: token, kind: .unhop, value: output, operation: operation)
            try await tx.notifyChange()
            return (try await tx.requireRun(run.id, operation: operation), event)
        }
    }

    @discardableResult
    package func recordError(
        runID: Int64, step: String?, message: String, final: Bool, owner: String?, following: Int64?
    ) async throws -> HistoryEntry {
        let operation = "record error of run \(runID)"
        return try await transaction(operation) { tx in
            _ = try await tx.requireUnfinished(runID, owner: owner, following: following, operation: operation)
            let event = try await tx.append(runID: runID, final ? .fail : .error, step: step, value: message)
            if final { try await tx.setStatus(runID, .failed) }
            if owner == nil { try await tx.notifyChange() }
            return event
        }
    }

    // MARK: Reading runs

    package func run(id: Int64) async throws -> RunRecord? {
        try await readOne(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE id = $1", [.int(id)], operation: "read run \(id)",
            RunRecord.init(pg:))
    }

    package func latestRun(flow: String, subject: String) async throws -> RunRecord? {
        try validate(flow, as: "flow name")
        try validate(subject, as: "subject")
        return try await readOne(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE flow = $1 AND subject = $2 ORDER BY id DESC LIMIT 1",
            [.text(flow), .text(subject)], operation: "read latest run of \(flow) for \(subject)", RunRecord.init(pg:))
    }

    package func history(runID: Int64, limit: Int?) async throws -> [HistoryEntry] {
        let operation = "read history of run \(runID)"
        if let limit {
            return try await read(
                "SELECT * FROM (SELECT \(HistoryEntry.pgColumns) FROM history WHERE run_id = $1 ORDER BY seq DESC LIMIT $2) AS last ORDER BY seq",
                [.int(runID), .int(Int64(max(0, limit)))], operation: operation, HistoryEntry.init(pg:))
        }
        return try await read(
            "SELECT \(HistoryEntry.pgColumns) FROM history WHERE run_id = $1 ORDER BY seq", [.int(runID)],
            operation: operation, HistoryEntry.init(pg:))
    }

    package func histories(runIDs: [Int64]) async throws -> [Int64: [HistoryEntry]] {
        guard !runIDs.isEmpty else { return [:] }
        // Each row goes straight to its run's entries as it arrives.
        let query = PostgresValue.query(
            "SELECT \(HistoryEntry.pgColumns) FROM history WHERE run_id = ANY($1) ORDER BY run_id, seq",
            [.ints(runIDs)])
        return try await retried("read the histories of \(runIDs.count) runs") {
            try await client.fold(query, into: [Int64: [HistoryEntry]]()) { histories, row in
                let entry = try HistoryEntry(pg: Row(row))
                histories[entry.runID, default: []].append(entry)
            }
        }
    }

    package func statuses(of runIDs: [Int64]) async throws -> [Int64: (status: RunStatus, owner: String?)] {
        guard !runIDs.isEmpty else { return [:] }
        let rows = try await read(
            "SELECT id, status, owner FROM runs WHERE id = ANY($1)", [.ints(runIDs)], operation: "read run statuses"
        ) { (try $0.int64(0), RunStatus(rawValue: try $0.text(1)) ?? .failed, try $0.optionalText(2)) }
        var statuses: [Int64: (status: RunStatus, owner: String?)] = [:]
        for row in rows { statuses[row.0] = (row.1, row.2) }
        return statuses
    }

    // MARK: Ownership

    package func claim(runID: Int64, owner: String, until: Date) async throws -> RunRecord? {
        let lease = leaseLength(until: until)  // before any wait (see `leaseLength(until:)`)
        try await ensureLiveness(of: owner)
        // Waits for a row another transaction is writing (an unhop): the run is then claimed as it stands after it.
        return try await transaction("claim run \(runID)") { tx in
            try await tx.claim("id = $1", .int(runID), owner: owner, lease: lease, skipLocked: false).first
        }
    }

    package func claim(runIDs: [Int64], owner: String, until: Date) async throws -> [RunRecord] {
        guard !runIDs.isEmpty else { return [] }
        let lease = leaseLength(until: until)  // before any wait (see `leaseLength(until:)`)
        try await ensureLiveness(of: owner)
        // Rows another engine is claiming are skipped, not waited for: N engines resuming at once
        // each take different runs.
        return try await transaction("claim \(runIDs.count) runs") { tx in
            try await tx.claim("id = ANY($1)", .ints(runIDs), owner: owner, lease: lease, skipLocked: true)
        }
    }

    /// Renews `owner`'s leases of `runIDs`. An incarnation made here renews them on the
    /// connection that holds its liveness lock, once the lock is held: never behind the
    /// statements waiting for a connection of the pool (a burst of writes, rows another client
    /// locked), nor for the pool to connect again after an outage, when it pauses up to a minute
    /// between tries. The lock's connection connects again within 5 s, and the renewal goes
    /// through as soon as the lock is held again: within the grace after a server's start
    /// (``graceAfterServerStart``) that keeps other engines from taking the runs as expired.
    ///
    /// A run whose row another transaction holds is skipped, not waited for: a transaction that
    /// keeps one run's row locked (an operator's `UPDATE` left uncommitted, a write of the run
    /// that waits for its subject's lock) held back the renewal of every other lease of the
    /// engine, which ran out, and another engine could take those runs over while they ran on.
    /// The skipped runs are renewed one by one by statements that wait for their rows, in a task
    /// of its own (one per engine at a time), so that once a row is let go the owner renews the
    /// lease before a claim that came later can take the run; meanwhile no claim can take it
    /// either (a claim locks the row). Each statement holds no row while it waits: a run skipped
    /// for a moment (its engine was writing it) is never held up behind another one's wait. The
    /// result says only the runs renewed without waiting.
    @discardableResult
    package func renewLeases(owner: String, runIDs: [Int64], until: Date) async throws -> Set<Int64> {
        guard !runIDs.isEmpty else { return [] }
        // Once, before any wait: a skipped run's statement, whenever it runs, renews its lease for
        // as long as asked (see `leaseLength(until:)`).
        let lease = leaseLength(until: until)
        let renewed = try await renewLeases(owner: owner, runIDs: runIDs, lease: lease, skipLocked: true)
        let skipped = runIDs.filter { !renewed.contains($0) }
        if !skipped.isEmpty, renewalsWaiting.withLock({ $0.insert(owner).inserted }) {
            Task {
                defer { _ = renewalsWaiting.withLock { $0.remove(owner) } }
                // A run skipped because it is no longer the owner's is not waited for (its row no
                // longer matches); a failure is left to the next renewal, which tries again.
                for runID in skipped.sorted() {
                    _ = try? await renewLeases(owner: owner, runIDs: [runID], lease: lease, skipLocked: false)
                }
            }
        }
        return renewed
    }

    /// Renews `owner`'s leases of `runIDs` for `lease` milliseconds from when the statement runs,
    /// skipping the rows another transaction holds (`skipLocked`) or waiting for them; returns
    /// the runs renewed.
    private func renewLeases(
        owner: String, runIDs: [Int64], lease: Int64, skipLocked: Bool
    ) async throws -> Set<Int64> {
        let operation = "renew leases"
        let sql = """
            UPDATE runs SET lease_expires_at = \(PostgresStore.serverNow) + $3
            WHERE id IN (
                SELECT id FROM runs WHERE id = ANY($1) AND owner = $2 AND status = 'running'
                FOR UPDATE\(skipLocked ? " SKIP LOCKED" : "")
            )
            RETURNING id
            """
        let values: [PostgresValue] = [.ints(runIDs), .text(owner), .int(lease)]
        // The wait for locked rows goes through the pool: it must not hold the liveness lock's
        // connection, on which the next renewals go.
        guard skipLocked, let lock = locks.withLock({ $0[owner]?.lock }) else {
            return try await transaction(operation) { tx in Set(try await tx.query(sql, values) { try $0.int64(0) }) }
        }
        // One statement, so one transaction of its own. A deadlock the server broke (with a claim
        // of the same runs) runs it again; so does a lost connection, once the lock is taken again.
        return try await retried(operation) {
            let rows = try await lock.held().rows(of: PostgresValue.query(sql, values))
            return Set(try rows.map { try Row($0).int64(0) })
        }
    }

    package func release(runIDs: [Int64], owner: String) async throws {
        guard !runIDs.isEmpty else { return }
        let operation = runIDs.count == 1 ? "release run \(runIDs[0])" : "release \(runIDs.count) runs"
        try await transaction(operation) { tx in
            let released = try await tx.run(
                "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE id = ANY($1) AND owner = $2 RETURNING 1",
                [.ints(runIDs), .text(owner)])
            if released > 0 { try await tx.notifyChange() }
        }
    }

    /// Releases the runs of owners whose liveness lock no session of the server holds: their
    /// connection, hence their process, is gone.
    ///
    /// Not within ``graceAfterServerStart`` of the server's start (``serverAge``: since an
    /// engine first found it answering, which a failover resets): a restart or a failover ends
    /// every session, so no lock is held until each engine has connected again (with a pause of
    /// up to 5 s while the server was away). Before, the first engine back took the others' runs
    /// in flight, and their steps ran again beside the ones still running. Meanwhile a run whose
    /// engine died is taken over when its lease expires, or once the grace has passed.
    ///
    /// The first look that finds the server not yet seen since it started records it
    /// (``recordServerStart()``): the grace counts from then.
    @discardableResult
    package func releaseRunsOfDeadIncarnations(except own: Incarnation) async throws -> [(owner: String, runs: Int)] {
        // One statement, every `deadEngineCheckInterval` of every engine; a row without an
        // owner says that the server was not seen since it started.
        let found = try await read(
            Self.deadOwnersSQL, [.text(own.id), .int(Self.graceAfterServerStart)],
            operation: "list the engines that are gone"
        ) { try $0.optionalText(0) }
        if found.contains(nil) { try await recordServerStart() }
        let dead = found.compactMap { $0 }
        guard !dead.isEmpty else { return [] }
        var released: [(owner: String, runs: Int)] = []
        for owner in dead {
            let operation = "release the runs of dead engine \(owner)"
            let count = try await transaction(operation) { tx in
                let count = try await tx.run(
                    "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE owner = $1 AND status = 'running' RETURNING 1",
                    [.text(owner)])
                if count > 0 { try await tx.notifyChange() }
                return count
            }
            released.append((owner, count))
        }
        return released
    }

    /// Records that an engine found the server answering since it started (``serverAge``), once
    /// per start of the server: the first engine to record it after a restart or a failover
    /// starts the grace (``graceAfterServerStart``). Each engine records it too as it takes its
    /// liveness lock (again), the first thing it does on a server back.
    func recordServerStart() async throws {
        try await transaction("record the server's start") { tx in try await tx.run(Self.recordServerStartSQL) }
    }

    /// The statement of ``recordServerStart()``: one statement, a transaction of its own.
    ///
    /// It removes the rows of the server's earlier starts, which no engine reads again: only
    /// the current start's row counts (``serverAge``), and a start whose row is missing counts
    /// as just seen, which only lengthens the grace. The table keeps one row, not one per
    /// restart or failover for the life of the database.
    static let recordServerStartSQL = """
        WITH earlier AS (DELETE FROM server_starts WHERE started_at <> pg_postmaster_start_time())
        INSERT INTO server_starts (started_at, first_seen_at) VALUES (pg_postmaster_start_time(), clock_timestamp())
        ON CONFLICT (started_at) DO NOTHING
        """

    /// The owners of running runs whose liveness lock (key: the owner value's last 16 hex
    /// digits, as ``AdvisoryLock`` takes it) no session of the server holds, but `$1` (the
    /// engine's own), once the server started more than `$2` ms ago (``serverAge``); and a
    /// row whose owner is `NULL` when no engine recorded the server's start yet
    /// (``recordServerStart()``).
    ///
    /// The owners are found one search of the index by owner after another (the next owner
    /// after the last, until there is none), each kept if it holds a running run: as many
    /// searches as there are owners, whatever the number of runs. Before, every owned run was
    /// read and the owners sorted out of them, then at every poll of every engine: 140–200 ms at
    /// 40,000 runs in flight (four engines at their bound of 10,000), against 3–5 ms now.
    package static let deadOwnersSQL = """
        WITH RECURSIVE owners(owner) AS (
            SELECT min(owner) FROM runs WHERE owner IS NOT NULL
            UNION ALL
            SELECT (SELECT min(r.owner) FROM runs r WHERE r.owner > o.owner) FROM owners o WHERE o.owner IS NOT NULL
        )
        SELECT o.owner FROM owners o
        CROSS JOIN LATERAL (SELECT ('x' || right(o.owner, 16))::bit(64)::bigint AS key) AS k
        WHERE o.owner IS NOT NULL AND o.owner <> $1 AND o.owner ~ '#[0-9a-fA-F]{16}$'
            AND \(PostgresStore.serverAge) > $2
            AND EXISTS (SELECT 1 FROM runs r WHERE r.owner = o.owner AND r.status = 'running')
            AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE \(AdvisoryLock.heldOnKey))
        UNION ALL
        SELECT NULL WHERE NOT EXISTS (SELECT 1 FROM server_starts s WHERE s.started_at = pg_postmaster_start_time())
        """

    package func claimableRuns(versions: [String: [String]], now: Date, limit: Int) async throws -> [RunRecord] {
        var runs: [RunRecord] = []
        for (flow, flowVersions) in versions.sorted(by: { $0.key < $1.key }) {
            runs += try await read(
                """
                SELECT \(RunRecord.pgColumns) FROM runs
                WHERE status = 'running' AND flow = $1
                    AND (owner IS NULL OR \(PostgresStore.leaseRunOut(grace: "$4"))) AND flow_version = ANY($2)
                ORDER BY id LIMIT $3
                """,
                [.text(flow), .texts(flowVersions), .int(Int64(max(0, limit))), .int(Self.graceAfterServerStart)],
                operation: "list runs to resume of \(flow)", RunRecord.init(pg:))
        }
        return Array(runs.sorted { $0.id < $1.id }.prefix(limit))
    }

    package func dueTimeouts(now: Date) async throws -> [RunRecord] {
        // Asked at every poll: read only once the next deadline has come (``DueLook``).
        guard let wakeAt = try await nextDue().wakeAt, wakeAt <= Clock.milliseconds(now) else { return [] }
        forgetDueLook()
        return try await read(
            "SELECT \(RunRecord.pgColumns) FROM runs WHERE wake_at <= $1 AND status = 'parked' ORDER BY wake_at",
            [.int(Clock.milliseconds(now))], operation: "list due timeouts", RunRecord.init(pg:))
    }

    // MARK: Subject state

    package func isFirstUse(subject: String, feature: String) async throws -> Bool {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        return try await readOne(
            "SELECT 1 FROM first_use WHERE subject = $1 AND feature = $2", [.text(subject), .text(feature)],
            operation: "read first use of \(feature)"
        ) { _ in true } == nil
    }

    package func markUsed(subject: String, feature: String) async throws {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        try await transaction("mark \(feature) used") { tx in
            try await tx.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                [.text(subject), .text(feature), .int(Clock.milliseconds(self.now()))])
        }
    }

    package func session(subject: String) async throws -> StoredSession? {
        try validate(subject, as: "subject")
        return try await readOne(
            "SELECT user_id, token, created_at, expires_at FROM sessions WHERE subject = $1 AND (expires_at IS NULL OR expires_at > $2)",
            [.text(subject), .int(Clock.milliseconds(now()))], operation: "read session of \(subject)",
            StoredSession.decoder(subject: subject))
    }

    @discardableResult
    package func storeSession(subject: String, userID: String, token: String, expiresAt: Date?) async throws -> [Int64]
    {
        try validate(subject, as: "subject")
        try validate(userID, as: "user id")
        try StorageRules(location: location).checkSession(token: token, expiresAt: expiresAt, now: now())
        let operation = "store session of \(subject)"
        // Once the transaction is over: the session comes due at its expiry (``DueLook``).
        defer { if expiresAt != nil { dueWritten() } }
        return try await transaction(operation) { tx in
            try await tx.lockSubject(subject)
            try await tx.run(
                """
                INSERT INTO sessions (subject, user_id, token, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (subject) DO UPDATE SET user_id = EXCLUDED.user_id, token = EXCLUDED.token,
                    created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
                """,
                [
                    .text(subject), .text(userID), .text(token), .int(Clock.milliseconds(self.now())),
                    .optional(expiresAt.map(Clock.milliseconds)),
                ])
            let unhopped = try await tx.unhopLoginSteps(subject: subject, userID: userID, operation: operation)
            if !unhopped.isEmpty { try await tx.notifyChange() }
            return unhopped
        }
    }

    @discardableResult
    package func deleteSession(subject: String, userID: String?) async throws -> (removed: Bool, rerouted: [Int64]) {
        try validate(subject, as: "subject")
        if let userID { try validate(userID, as: "user id") }
        let operation = "delete session of \(subject)"
        return try await transaction(operation) { tx in
            try await tx.lockSubject(subject)
            if let userID {
                let stored = try await tx.queryOne(
                    "SELECT user_id FROM sessions WHERE subject = $1 FOR UPDATE", [.text(subject)]
                ) { try $0.text(0) }
                try StorageRules(location: tx.location).checkSessionUser(
                    userID, stored: stored, subject: subject, operation: operation)
            }
            let removed = try await tx.run("DELETE FROM sessions WHERE subject = $1 RETURNING 1", [.text(subject)]) > 0
            let rerouted = try await tx.rerouteSessionSteps(
                subject: subject, reason: "session-removed", operation: operation)
            if !rerouted.isEmpty { try await tx.notifyChange() }
            return (removed, rerouted)
        }
    }

    @discardableResult
    package func expireSessions(now: Date) async throws -> [Int64] {
        let due = Clock.milliseconds(now)
        // Asked at every poll: a transaction only once the next expiry has come (``DueLook``).
        guard let expiresAt = try await nextDue().expiresAt, expiresAt <= due else { return [] }
        forgetDueLook()
        let operation = "expire sessions"
        return try await transaction(operation) { tx in
            var rerouted: [Int64] = []
            // Each subject's lock before its session's row, in one order: as a login takes them.
            let expired = try await tx.query("SELECT subject FROM sessions WHERE expires_at <= $1", [.int(due)]) {
                try $0.text(0)
            }
            try await tx.lockSubjects(expired)
            // Those of them still expired: a login meanwhile stored a new session.
            let subjects = try await tx.query(
                "DELETE FROM sessions WHERE subject = ANY($1) AND expires_at <= $2 RETURNING subject",
                [.texts(expired), .int(due)]
            ) { try $0.text(0) }
            for subject in subjects.sorted() {
                rerouted += try await tx.rerouteSessionSteps(
                    subject: subject, reason: "session-expired", operation: operation)
            }
            if !rerouted.isEmpty { try await tx.notifyChange() }
            return rerouted
        }
    }

    package func fact(subject: String, key: String) async throws -> String? {
        try validate(subject, as: "subject")
        try validate(key, as: "fact key")
        return try await readOne(
            "SELECT value FROM facts WHERE subject = $1 AND key = $2", [.text(subject), .text(key)],
            operation: "read fact \(key)"
        ) { try $0.text(0) }
    }

    package func setFact(subject: String, key: String, value: String) async throws {
        try validate(subject, as: "subject")
        try validate(key, as: "fact key")
        try await transaction("set fact \(key)") { tx in
            try await tx.run(
                """
                INSERT INTO facts (subject, key, value, updated_at) VALUES ($1, $2, $3, $4)
                ON CONFLICT (subject, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
                """, [.text(subject), .text(key), .text(value), .int(Clock.milliseconds(self.now()))])
        }
    }
}

extension PostgresTransaction {
    /// Applies one write of an engine's for run `runID`, fenced by `owner` and, with
    /// `following`, by the last history entry the engine saw.
    func record(_ write: RunWrite, runID: Int64, owner: String?, following: Int64?) async throws -> HistoryEntry {
        let operation = write.operation(runID: runID)
        switch write {
        case .hop(let step, let from, let parks, let wakeOn, let deadline):
            return try await hop(
                runID: runID, step: step, from: from, parks: parks, wakeOn: wakeOn, deadline: deadline, owner: owner,
                following: following, operation: operation)
        case .unhop(let token, let output):
            let run = try await requireUnfinished(runID, owner: owner, following: following, operation: operation)
            return try await endStep(run, token: token, kind: .unhop, value: output, operation: operation)
        case .decision(let name, let value):
            _ = try await requireRunning(runID, owner: owner, following: following, operation: operation)
            return try await append(runID: runID, .decision, step: name, value: value)
        case .patch(let name):
            _ = try await requireRunning(runID, owner: owner, following: following, operation: operation)
            return try await append(runID: runID, .patch, step: name)
        case .timer(let name, let deadline):
            _ = try await requireRunning(runID, owner: owner, following: following, operation: operation)
            return try await append(
                runID: runID, .timer, step: name,
                value: HistoryEntry.deadlineValue(.timer, milliseconds: Clock.milliseconds(deadline)))
        case .markUsed(let feature):
            let run = try await requireRunning(runID, owner: owner, following: following, operation: operation)
            try await self.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                [.text(run.subject), .text(feature), .int(Clock.milliseconds(store.now()))])
            return try await append(runID: runID, .effect, step: markUsedEffectName(feature))
        case .complete:
            _ = try await requireRunning(runID, owner: owner, following: following, operation: operation)
            let event = try await append(runID: runID, .complete)
            try await setStatus(runID, .completed)
            return event
        }
    }

    /// Records that run `runID` entered `step` with a fresh token; a parking step parks the run
    /// and gives up its lease, and ends at once when the change it waits for already came.
    private func hop(
        runID: Int64, step: String, from: String?, parks: Bool, wakeOn: WakeCondition?, deadline: Date?,
        owner: String?, following: Int64?, operation: String
    ) async throws -> HistoryEntry {
        let run = try await requireRunning(runID, owner: owner, following: following, operation: operation)
        if let inFlight = run.currentStep, run.currentToken != nil {
            throw refuse(.refused, operation, "step '\(inFlight)' is still in flight; it must unhop first")
        }
        if let from { try await append(runID: runID, .transition, step: step, value: from) }
        let token = Token.random()
        let deadlineValue = deadline.map { HistoryEntry.deadlineValue(.hop, milliseconds: Clock.milliseconds($0)) }
        let event = try await append(
            runID: runID, .hop, step: step, token: token, value: deadlineValue, touchesRun: false)
        try await self.run(
            """
            UPDATE runs SET current_step = $2, current_token = $3, status = $4, wake_on = $5, wake_at = $6,
                owner = CASE WHEN $7 THEN NULL ELSE owner END,
                lease_expires_at = CASE WHEN $7 THEN NULL ELSE lease_expires_at END,
                updated_at = $8
            WHERE id = $1
            """,
            [
                .int(runID), .text(step), .text(token),
                .text(parks ? RunStatus.parked.rawValue : RunStatus.running.rawValue),
                .optional(parks ? wakeOn?.rawValue : nil), .optional(parks ? deadline.map(Clock.milliseconds) : nil),
                .bool(parks), .int(Clock.milliseconds(store.now())),
            ])
        if parks, let wakeOn {
            let stored = try await session(subject: run.subject)
            switch (wakeOn, stored) {
            case (.sessionStored, let stored?):
                try await unhopLoginSteps(subject: run.subject, userID: stored.userID, operation: operation)
            case (.sessionRemoved, nil):
                try await rerouteSessionSteps(subject: run.subject, reason: "session-removed", operation: operation)
            default:
                break
            }
        }
        return event
    }

    /// Claims the running runs `selection` (over `$1`) picks that nobody else holds: no owner,
    /// the claimer itself, or a lease that ran out (``PostgresStore/leaseRunOut(grace:)``), for
    /// `lease` milliseconds from when the statement runs. Records a takeover where one changes hands.
    func claim(
        _ selection: String, _ selected: PostgresValue, owner: String, lease: Int64, skipLocked: Bool
    ) async throws -> [RunRecord] {
        let claimed = try await query(
            """
            WITH free AS (
                SELECT id, last_owner FROM runs
                WHERE \(selection) AND status = 'running'
                    AND (owner IS NULL OR owner = $2 OR \(PostgresStore.leaseRunOut(grace: "$4")))
                ORDER BY id FOR UPDATE\(skipLocked ? " SKIP LOCKED" : "")
            )
            UPDATE runs SET owner = $2, last_owner = $2, lease_expires_at = \(PostgresStore.serverNow) + $3
            FROM free WHERE runs.id = free.id
            RETURNING \(RunRecord.pgQualifiedColumns), free.last_owner
            """,
            [selected, .text(owner), .int(lease), .int(PostgresStore.graceAfterServerStart)]
        ) { (try RunRecord(pg: $0), try $0.optionalText(13)) }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for (run, previous) in claimed {
            guard let previous, previous != owner else { continue }
            let value = String(decoding: try encoder.encode(["from": previous, "to": owner]), as: UTF8.self)
            try await append(
                runID: run.id, .takeover, step: Incarnation.label(of: owner), value: value, touchesRun: false)
        }
        return claimed.map(\.0).sorted { $0.id < $1.id }
    }
}
