#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

// How the records are read from this store's rows: the one place that knows their columns.

extension RunRecord {
    static let columns =
        "id, flow, subject, flow_version, status, current_step, current_token, wake_on, owner, lease_expires_at, created_at, updated_at, wake_at, lease_boot, wake_boot, wake_uptime"

    init(row: Row) {
        id = row.int64(0)
        flow = row.text(1)
        subject = row.text(2)
        flowVersion = row.text(3)
        status = RunStatus(rawValue: row.text(4)) ?? .failed
        currentStep = row.optionalText(5)
        currentToken = row.optionalText(6)
        wakeOn = row.optionalText(7).flatMap(WakeCondition.init(rawValue:))
        owner = row.optionalText(8)
        // By the uptime clock in this boot (schema 9), else by the wall clock: shown by the wall clock.
        leaseExpiresAt = row.optionalInt64(9).map {
            UptimeClock.machine.wallClockEnd(expiresAt: $0, boot: row.optionalInt64(13))
        }
        createdAt = Clock.date(row.int64(10))
        updatedAt = Clock.date(row.int64(11))
        wakeAt = row.optionalInt64(12).map {
            UptimeClock.machine.wallClockDeadline(wall: $0, uptime: row.optionalInt64(15), boot: row.optionalInt64(14))
        }
    }
}

extension RunHead {
    /// The run's columns and the number of its last history entry: one statement for a write's
    /// check and its entry's number (the subquery is a seek on the history's primary key).
    static let columns =
        "id, subject, status, owner, current_step, current_token, (SELECT coalesce(max(seq), 0) FROM history WHERE run_id = runs.id)"

    init(row: Row) {
        id = row.int64(0)
        subject = row.text(1)
        status = RunStatus(rawValue: row.text(2)) ?? .failed
        owner = row.optionalText(3)
        currentStep = row.optionalText(4)
        currentToken = row.optionalText(5)
        lastSeq = row.int64(6)
    }
}

extension HistoryEntry {
    static let columns = "run_id, seq, kind, step, token, value, at, deadline_boot, deadline_uptime"

    init(row: Row) {
        runID = row.int64(0)
        seq = row.int64(1)
        kind = HistoryKind(rawValue: row.text(2)) ?? .error
        step = row.optionalText(3)
        token = row.optionalText(4)
        value = row.optionalText(5)
        at = Clock.date(row.int64(6))
        // A deadline kept by the uptime clock in this boot (schema 11) reads as the time by the
        // wall clock as it now stands, which a step of the wall clock moves along with now. One
        // of an earlier boot (or of no known boot) goes by the wall clock itself.
        if value != nil, kind == .timer || kind == .hop {
            if let uptime = row.optionalInt64(8),
                let deadline = UptimeClock.machine.wallClockTime(uptime: uptime, boot: row.optionalInt64(7))
            {
                value = HistoryEntry.deadlineValue(kind, milliseconds: Clock.milliseconds(deadline))
            } else {
                deadlineGoesByTheWallClock = true
            }
        }
    }
}

extension RunStatus {
    /// The status as an SQL literal, for the statements that select by status.
    ///
    /// Written into the statement rather than bound: it is a constant of the code, never a value
    /// from outside, and SQLite uses a partial index (`WHERE status IN ('running', 'parked')`)
    /// only when the statement's own text implies the index's condition (see ``condition``).
    var sql: String { "'\(rawValue)'" }

    /// The unfinished statuses as an SQL list, `('running', 'parked')`.
    static let unfinishedSQL = "(" + allCases.filter(\.isUnfinished).map(\.sql).joined(separator: ", ") + ")"

    /// The condition "the run has this status", written so that SQLite can use the partial
    /// indexes on unfinished runs: to SQLite's planner `status = 'running'` alone does not imply
    /// the indexes' `status IN ('running', 'parked')`, and it then reads every run of a flow,
    /// finished ones included, and sorts them.
    var condition: String {
        isUnfinished ? "status IN \(Self.unfinishedSQL) AND status = \(sql)" : "status = \(sql)"
    }
}

extension HistoryKind {
    /// The kind as an SQL literal (see ``RunStatus/sql``).
    var sql: String { "'\(rawValue)'" }

    /// The kinds that end a step, as an SQL list, `('unhop', 'timeout', 'reroute')`.
    static let stepEndsSQL = "(" + allCases.filter(\.endsStep).map(\.sql).joined(separator: ", ") + ")"

    /// The kinds replay matches against the flow code, as an SQL list.
    static let replayedSQL = "(" + allCases.filter(\.isReplayed).map(\.sql).joined(separator: ", ") + ")"
}
