#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#endif

extension HopStore {
    /// A new engine incarnation labelled `label`, holding the liveness lock beside this database
    /// (see ``Incarnation``). Keep it for as long as the engine executes runs.
    package nonisolated func makeIncarnation(label: String) -> Incarnation {
        let incarnation = Incarnation(label: label, databasePath: path)
        heartbeats.add(incarnation)
        return incarnation
    }

    /// Takes run `runID` for the incarnation `owner` until `until`, unless another incarnation
    /// holds a live lease on it. Returns the run when taken, `nil` when it is held elsewhere or
    /// finished. When the run changes hands, a `takeover` entry records it in the run's history.
    package nonisolated func claim(runID: Int64, owner: String, until: Date) async throws -> RunRecord? {
        try await claim(runID: runID, owner: owner, lease: LeaseLength(until: until))
    }

    private func claim(runID: Int64, owner: String, lease length: LeaseLength) async throws -> RunRecord? {
        let operation = "claim run \(runID)"
        let claimed = try await transaction(operation) { tx in
            try tx.claim(
                selection: "id = ?1", [.integer(runID)], owner: owner, until: length.endFromNow, operation: operation
            )
            .first
        }
        if claimed != nil { forgetLostRuns([runID]) }
        return claimed
    }

    /// Takes every run of `runIDs` that no other incarnation holds for `owner` until `until`, in
    /// one transaction; returns the runs taken, as stored (a resuming engine claims its runs so).
    package nonisolated func claim(runIDs: [Int64], owner: String, until: Date) async throws -> [RunRecord] {
        guard !runIDs.isEmpty else { return [] }
        return try await claim(runIDs: runIDs, owner: owner, lease: LeaseLength(until: until))
    }

    private func claim(runIDs: [Int64], owner: String, lease length: LeaseLength) async throws -> [RunRecord] {
        let operation = "claim \(runIDs.count) runs"
        let claimed = try await transaction(operation) { tx in
            try tx.claim(
                selection: "id IN (SELECT value FROM json_each(?1))", [.text(Self.jsonList(runIDs))], owner: owner,
                until: length.endFromNow,
                operation: operation)
        }
        forgetLostRuns(claimed.map(\.id))
        return claimed
    }

    /// Extends `owner`'s leases on `runIDs` (the runs it is executing) to `until`, in one
    /// statement; returns the runs whose lease was extended. A run missing from the result is
    /// no longer the owner's: it finished, parked, or another incarnation took it over.
    @discardableResult
    package nonisolated func renewLeases(owner: String, runIDs: [Int64], until: Date) async throws -> Set<Int64> {
        guard !runIDs.isEmpty else { return [] }
        return try await renewLeases(owner: owner, runIDs: runIDs, lease: LeaseLength(until: until))
    }

    private func renewLeases(owner: String, runIDs: [Int64], lease length: LeaseLength) async throws -> Set<Int64> {
        let operation = "renew leases"
        return try await transaction(operation) { tx in
            let lease = UptimeClock.machine.lease(until: length.endFromNow)
            return Set(
                try tx.query(
                    """
                    UPDATE runs SET lease_expires_at = ?3, lease_boot = ?4
                    WHERE id IN (SELECT value FROM json_each(?1)) AND owner = ?2 AND status = \(RunStatus.running.sql)
                    RETURNING id
                    """,
                    [
                        .text(Self.jsonList(runIDs)), .text(owner), .integer(lease.expiresAt),
                        .optional(lease.boot),
                    ],
                    operation: operation
                ) { $0.int64(0) })
        }
    }

    /// Gives up `owner`'s leases on the runs of `runIDs` it holds, so another engine may take
    /// them at once; one statement.
    package func release(runIDs: [Int64], owner: String) async throws {
        guard !runIDs.isEmpty else { return }
        let operation = runIDs.count == 1 ? "release run \(runIDs[0])" : "release \(runIDs.count) runs"
        try await transaction(operation) { tx in
            try tx.run(
                """
                UPDATE runs SET owner = NULL, lease_expires_at = NULL
                WHERE id IN (SELECT value FROM json_each(?1)) AND owner = ?2
                """,
                [.text(Self.jsonList(runIDs)), .text(owner)], operation: operation)
        }
    }

    /// Finds the incarnations on this host whose process is gone (their liveness lock is free),
    /// releases the runs they held, so that any engine may claim them at once, and forgets them.
    /// Returns the dead incarnations' owner values with the number of runs each held.
    @discardableResult
    package func releaseRunsOfDeadIncarnations(except own: Incarnation) async throws -> [(owner: String, runs: Int)] {
        var released: [(owner: String, runs: Int)] = []
        let locks = LivenessLocks(databasePath: path)
        let dead = locks.dead(except: own.id)
        // Every dead file found is let go of, whatever happens; a failed release is retried next time.
        var forgettable: [(name: String, descriptor: Int32)] = []
        defer {
            for (name, descriptor) in forgettable { locks.forget(name: name, descriptor: descriptor) }
            for entry in dead where !forgettable.contains(where: { $0.name == entry.name }) { close(entry.descriptor) }
        }
        for entry in dead {
            if !entry.owner.isEmpty {
                let operation = "release the runs of dead engine \(entry.owner)"
                let count = try await transaction(operation) { tx in
                    try tx.run(
                        "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE owner = ?1 AND status = \(RunStatus.running.sql)",
                        [.text(entry.owner)], operation: operation)
                }
                released.append((entry.owner, count))
            }
            forgettable.append((entry.name, entry.descriptor))
        }
        return released
    }

    /// Unfinished, unparked runs of the given flows, on one of the given versions of each, that no
    /// engine holds (no owner, or an expired lease whose owner does not wait for the write lock:
    /// see ``LivenessLocks``), oldest first.
    package func claimableRuns(
        versions: [String: [String]], now: Date = Date(), limit: Int = .max
    ) throws -> [RunRecord] {
        var runs: [RunRecord] = []
        for (flow, flowVersions) in versions.sorted(by: { $0.key < $1.key }) {
            runs += try connection.query(
                Self.claimableRunsSQL,
                [
                    .text(flow), .integer(Clock.milliseconds(now)), .text(Self.jsonList(flowVersions)),
                    .integer(Int64(limit)), .optional(UptimeClock.machine.boot),
                    .integer(UptimeClock.uptimeMilliseconds()),
                ],
                operation: "list runs to resume of \(flow)", RunRecord.init(row:))
        }
        return Array(runs.sorted { $0.id < $1.id }.prefix(limit))
    }

    /// The running runs of flow `?1` on a version of the list `?3` that no engine holds (by the
    /// wall clock `?2`, or in boot `?5` at uptime `?6`), the `?4` oldest: read through the index
    /// of unfinished runs, in its order, so that the finished runs of the flow, however many, are
    /// never read.
    static let claimableRunsSQL = """
        SELECT \(RunRecord.columns) FROM runs INDEXED BY runs_unfinished
        WHERE \(RunStatus.running.condition) AND flow = ?1
            AND (owner IS NULL OR (\(leaseOver(wall: "?2", boot: "?5", uptime: "?6")) AND NOT hop_owner_waits(owner)))
            AND flow_version IN (SELECT value FROM json_each(?3))
        ORDER BY id LIMIT ?4
        """

    /// Parked runs whose step's deadline has passed: by the uptime clock for a deadline of this
    /// boot (schema 10), by the wall clock `now` for one of no boot. A deadline of an earlier boot
    /// is first made one of no boot (its wall-clock time goes), once after a reboot.
    package func dueTimeouts(now: Date = Date()) async throws -> [RunRecord] {
        let operation = "list due timeouts"
        let boot = SQLValue.optional(UptimeClock.machine.boot)
        // (Two searches of the index by boot and uptime, for the boots before and after this one.)
        if try connection.queryOne(
            "SELECT 1 FROM runs WHERE wake_boot IS NOT NULL AND (?1 IS NULL OR wake_boot < ?1 OR wake_boot > ?1) LIMIT 1",
            [boot], operation: operation, { _ in true }) != nil
        {
            try await transaction(operation) { tx in
                try tx.run(
                    """
                    UPDATE runs SET wake_boot = NULL, wake_uptime = NULL
                    WHERE wake_boot IS NOT NULL AND (?1 IS NULL OR wake_boot < ?1 OR wake_boot > ?1)
                    """, [boot], operation: operation)
            }
        }
        return try connection.query(
            Self.dueTimeoutsSQL,
            [.integer(Clock.milliseconds(now)), boot, .integer(UptimeClock.uptimeMilliseconds())],
            operation: operation, RunRecord.init(row:))
    }

    /// The parked runs due by the wall clock `?1` (a deadline of no boot) or by uptime `?3` in
    /// boot `?2`: each a search of its own index, which holds no deadline of the other kind.
    static let dueTimeoutsSQL = """
        SELECT \(RunRecord.columns) FROM runs
        WHERE wake_boot = ?2 AND wake_uptime <= ?3 AND status = \(RunStatus.parked.sql)
        UNION ALL
        SELECT \(RunRecord.columns) FROM runs
        WHERE wake_boot IS NULL AND wake_at <= ?1 AND status = \(RunStatus.parked.sql)
        ORDER BY wake_at
        """

    /// The status and owner of each of `runIDs` that still exists.
    package func statuses(of runIDs: [Int64]) throws -> [Int64: (status: RunStatus, owner: String?)] {
        guard !runIDs.isEmpty else { return [:] }
        let rows = try connection.query(
            "SELECT id, status, owner FROM runs WHERE id IN (SELECT value FROM json_each(?1))",
            [.text(Self.jsonList(runIDs))],
            operation: "read run statuses"
        ) { ($0.int64(0), (status: RunStatus(rawValue: $0.text(1)) ?? .failed, owner: $0.optionalText(2))) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// SQL: whether the run's lease is over, at the wall-clock time `wall`, or at uptime `uptime`
    /// in boot `boot` (placeholders). A lease measured in this boot goes by the uptime clock
    /// (``UptimeClock``), one of another boot is over, one without a boot goes by the wall clock.
    /// No lease at all (an owner without one) is never over: only its engine's death frees the run.
    static func leaseOver(wall: String, boot: String, uptime: String) -> String {
        "CASE WHEN lease_boot IS NULL THEN lease_expires_at < \(wall) WHEN lease_boot = \(boot)"
            + " THEN lease_expires_at < \(uptime) ELSE lease_expires_at IS NOT NULL END"
    }

    /// `ids` as a JSON array, for `json_each(?)`: one bound parameter for any number of ids.
    static func jsonList(_ ids: [Int64]) -> String {
        "[" + ids.map(String.init).joined(separator: ",") + "]"
    }

    /// `texts` as a JSON array of strings, for `json_each(?)`.
    static func jsonList(_ texts: [String]) -> String {
        String(decoding: (try? JSONEncoder().encode(texts)) ?? Data("[]".utf8), as: UTF8.self)
    }
}

/// A lease asked for until `until` (by ``HopStore/now()``), measured from when the write that
/// takes or renews it runs: a write that waited for the file's write lock (another process held
/// it) holds its runs for as long as asked from its commit, as a server's lease does (there, the
/// length is added to the server's time as the statement runs). Measured from when it was asked
/// for, a lease written after a wait longer than itself was over when written: only the owner's
/// heartbeat and its next renewal kept the run. Taken as the store is called, before the call
/// waits for the store's connection, which a write waiting for the lock keeps busy.
struct LeaseLength: Sendable {
    let seconds: TimeInterval

    init(until: Date) { seconds = until.timeIntervalSinceNow }

    /// The lease's end for a write that runs now.
    var endFromNow: Date { Date().addingTimeInterval(seconds) }
}

extension WriteTransaction {
    /// Claims the running runs that `selection` (over `?1`) picks and nobody else holds: no
    /// owner, the claimer itself, or an expired lease whose owner does not wait for the file's
    /// write lock (``LivenessLocks``: one that waits is alive, kept from renewing only by another
    /// process's lock). Records a takeover where one changes hands.
    fileprivate func claim(
        selection: String, _ selected: [SQLValue], owner: String, until: Date, operation: String
    ) throws -> [RunRecord] {
        let now = Clock.nowMilliseconds()
        let lease = UptimeClock.machine.lease(until: until)
        // ?2 the claimer, ?3 now, ?4 its label, ?5 its lease's end, ?6 this boot, ?7 the uptime.
        let values: [SQLValue] = [
            .text(owner), .integer(now), .text(Incarnation.label(of: owner)), .integer(lease.expiresAt),
            .optional(lease.boot), .integer(UptimeClock.uptimeMilliseconds()),
        ]
        let over = HopStore.leaseOver(wall: "?3", boot: "?6", uptime: "?7")
        let claimable =
            "\(selection) AND status = \(RunStatus.running.sql)"
            + " AND (owner IS NULL OR owner = ?2 OR (\(over) AND NOT hop_owner_waits(owner)))"
        guard let waits = connection.ownerWaits else {
            throw refuse(.sqlite, operation, "the store's connection has no hop_owner_waits function")
        }
        return try waits.keepingAnswers {
            try takeOver(claimable: claimable, selected + values, operation: operation)
        }
    }

    /// The statements of ``claim(selection:_:owner:until:operation:)``: a `takeover` entry for
    /// each run of `claimable` that changes hands, then the claim itself.
    private func takeOver(claimable: String, _ values: [SQLValue], operation: String) throws -> [RunRecord] {
        try connection.run(
            """
            INSERT INTO history (run_id, seq, kind, step, value, at)
            SELECT id, coalesce((SELECT max(seq) FROM history WHERE run_id = runs.id), 0) + 1, \(HistoryKind.takeover.sql), ?4,
                json_object('from', last_owner, 'to', ?2), ?3
            FROM runs WHERE \(claimable) AND last_owner IS NOT NULL AND last_owner != ?2
            """,
            values, operation: operation)
        return try connection.query(
            """
            UPDATE runs SET owner = ?2, last_owner = ?2, lease_expires_at = ?5, lease_boot = ?6
            WHERE \(claimable)
            RETURNING \(RunRecord.columns)
            """,
            values, operation: operation, RunRecord.init(row:))
    }
}
