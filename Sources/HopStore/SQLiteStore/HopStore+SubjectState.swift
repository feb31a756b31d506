#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

extension HopStore {
    // MARK: First-use flags

    /// Whether `subject` has never used `feature` (or it was reset since).
    public func isFirstUse(subject: String, feature: String) throws -> Bool {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        return try connection.queryOne(
            "SELECT 1 FROM first_use WHERE subject = ?1 AND feature = ?2", [.text(subject), .text(feature)],
            operation: "read first use of \(feature)"
        ) { _ in true } == nil
    }

    /// The features `subject` has used, by name.
    public func firstUseFlags(subject: String) throws -> [FirstUseFlag] {
        try validate(subject, as: "subject")
        return try connection.query(
            "SELECT feature, used_at FROM first_use WHERE subject = ?1 ORDER BY feature", [.text(subject)],
            operation: "list first-use flags of \(subject)"
        ) { FirstUseFlag(feature: $0.text(0), usedAt: Clock.date($0.int64(1))) }
    }

    /// Marks `feature` used by `subject` now, unless it already is.
    public func markUsed(subject: String, feature: String) async throws {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        try await transaction("mark \(feature) used") { tx in
            try tx.run(
                "INSERT INTO first_use (subject, feature, used_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                [.text(subject), .text(feature), .integer(Clock.nowMilliseconds())], operation: "mark \(feature) used")
        }
    }

    /// Makes `features` first-use again for `subject`; returns how many were marked used before.
    @discardableResult
    public func resetFirstUse(subject: String, features: [String]) async throws -> Int {
        try validate(subject, as: "subject")
        for feature in features { try validate(feature, as: "feature name") }
        return try await transaction("reset first use") { tx in
            var count = 0
            for feature in features {
                count += try tx.run(
                    "DELETE FROM first_use WHERE subject = ?1 AND feature = ?2", [.text(subject), .text(feature)],
                    operation: "reset first use of \(feature)")
            }
            return count
        }
    }

    /// Makes `feature` first-use again for `subject` only while its flag is the one set at
    /// `usedAt`, to the second (as `hopctl first-use list` shows it): a retried reset never
    /// clears the flag a flow set again after the first.
    ///
    /// - Returns: how many flags were cleared: 0 when none is set.
    /// - Throws: `.refused`, changing nothing, when the flag was set at another time.
    @discardableResult
    public func resetFirstUse(subject: String, feature: String, ifUsedAt usedAt: Date) async throws -> Int {
        try validate(subject, as: "subject")
        try validate(feature, as: "feature name")
        let operation = "reset first use of \(feature)"
        return try await transaction(operation) { tx in
            let stored = try tx.queryOne(
                "SELECT used_at FROM first_use WHERE subject = ?1 AND feature = ?2", [.text(subject), .text(feature)],
                operation: operation
            ) { $0.int64(0) }
            try StorageRules(location: tx.path).checkFlagUsedAt(
                usedAt, stored: stored, feature: feature, subject: subject, operation: operation)
            return try tx.run(
                "DELETE FROM first_use WHERE subject = ?1 AND feature = ?2", [.text(subject), .text(feature)],
                operation: operation)
        }
    }

    /// Makes every feature first-use again for `subject`; returns how many flags were cleared.
    @discardableResult
    public func resetAllFirstUse(subject: String) async throws -> Int {
        try validate(subject, as: "subject")
        return try await transaction("reset first use") { tx in
            try tx.run(
                "DELETE FROM first_use WHERE subject = ?1", [.text(subject)], operation: "reset first use")
        }
    }

    // MARK: Sessions

    /// Stores the session of `subject` (replacing any other), and in the same transaction
    /// unhops the subject's runs parked on a step that waits for a session (``WakeCondition/sessionStored``).
    ///
    /// - Returns: the ids of the runs it unhopped; their login step's output is `{"userID": …}`.
    @discardableResult
    public func storeSession(
        subject: String, userID: String, token: String, expiresAt: Date? = nil
    ) async throws -> [Int64] {
        try validate(subject, as: "subject")
        try validate(userID, as: "user id")
        try StorageRules(location: path).checkSession(token: token, expiresAt: expiresAt, now: Date())
        let operation = "store session of \(subject)"
        return try await transaction(operation) { tx in
            try tx.run(
                """
                INSERT INTO sessions (subject, user_id, token, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
                ON CONFLICT (subject) DO UPDATE SET user_id = ?2, token = ?3, created_at = ?4, expires_at = ?5
                """,
                [
                    .text(subject), .text(userID), .text(token), .integer(Clock.nowMilliseconds()),
                    .optional(expiresAt.map(Clock.milliseconds)),
                ],
                operation: operation)
            return try tx.unhopLoginSteps(subject: subject, userID: userID, operation: operation)
        }
    }

    /// The stored session of `subject`; an expired session reads as none.
    public func session(subject: String) throws -> StoredSession? {
        try validate(subject, as: "subject")
        return try Self.session(subject: subject, on: connection, operation: "read session of \(subject)")
    }

    /// The stored, unexpired session of `subject`, read on `connection` (in a transaction or not).
    static func session(subject: String, on connection: Connection, operation: String) throws -> StoredSession? {
        try connection.queryOne(
            """
            SELECT user_id, token, created_at, expires_at FROM sessions
            WHERE subject = ?1 AND (expires_at IS NULL OR expires_at > ?2)
            """,
            [.text(subject), .integer(Clock.nowMilliseconds())], operation: operation
        ) {
            StoredSession(
                subject: subject, userID: $0.text(0), token: $0.text(1), createdAt: Clock.date($0.int64(2)),
                expiresAt: $0.optionalInt64(3).map(Clock.date))
        }
    }

    /// Removes the session of `subject` (a logout), and in the same transaction ends with a
    /// re-route the subject's parked steps that last only while a session is stored
    /// (``WakeCondition/sessionRemoved``).
    ///
    /// - Parameter userID: the user whose session is meant, so that a retried logout never logs
    ///   out the next user: refused, changing nothing, when another user's session is stored.
    /// - Returns: whether a session was stored, and the ids of the runs it re-routed.
    @discardableResult
    public func deleteSession(subject: String, userID: String? = nil) async throws -> (removed: Bool, rerouted: [Int64])
    {
        try validate(subject, as: "subject")
        if let userID { try validate(userID, as: "user id") }
        let operation = "delete session of \(subject)"
        return try await transaction(operation) { tx in
            if let userID {
                let stored = try tx.queryOne(
                    "SELECT user_id FROM sessions WHERE subject = ?1", [.text(subject)], operation: operation
                ) { $0.text(0) }
                try StorageRules(location: tx.path).checkSessionUser(
                    userID, stored: stored, subject: subject, operation: operation)
            }
            let removed =
                try tx.run("DELETE FROM sessions WHERE subject = ?1", [.text(subject)], operation: operation)
                > 0
            let rerouted = try tx.rerouteSessionSteps(
                subject: subject, reason: "session-removed", operation: operation)
            return (removed, rerouted)
        }
    }

    /// Removes every session whose expiry has come, as a logout does: in the same transaction, the
    /// parked steps of their subjects that last only while a session is stored end with a
    /// re-route. A daemon that was down at the expiry does this when it starts.
    ///
    /// - Returns: the ids of the runs it re-routed.
    @discardableResult
    package func expireSessions(now: Date = Date()) async throws -> [Int64] {
        let due = Clock.milliseconds(now)
        let query = "SELECT subject FROM sessions WHERE expires_at <= ?1"
        guard try !connection.query(query, [.integer(due)], operation: "read expired sessions", { $0.text(0) }).isEmpty
        else { return [] }
        let operation = "expire sessions"
        return try await transaction(operation) { tx in
            var rerouted: [Int64] = []
            for subject in try tx.query(query, [.integer(due)], operation: operation, { $0.text(0) }) {
                try tx.run("DELETE FROM sessions WHERE subject = ?1", [.text(subject)], operation: operation)
                rerouted += try tx.rerouteSessionSteps(
                    subject: subject, reason: "session-expired", operation: operation)
            }
            return rerouted
        }
    }

    // MARK: Facts

    /// Stores the daemon's fact `key` = `value` about `subject`.
    public func setFact(subject: String, key: String, value: String) async throws {
        try validate(subject, as: "subject")
        try validate(key, as: "fact key")
        try await transaction("set fact \(key)") { tx in
            try tx.run(
                """
                INSERT INTO facts (subject, key, value, updated_at) VALUES (?1, ?2, ?3, ?4)
                ON CONFLICT (subject, key) DO UPDATE SET value = ?3, updated_at = ?4
                """,
                [.text(subject), .text(key), .text(value), .integer(Clock.nowMilliseconds())],
                operation: "set fact \(key)")
        }
    }

    /// The value of fact `key` about `subject`, if stored.
    public func fact(subject: String, key: String) throws -> String? {
        try validate(subject, as: "subject")
        try validate(key, as: "fact key")
        return try connection.queryOne(
            "SELECT value FROM facts WHERE subject = ?1 AND key = ?2", [.text(subject), .text(key)],
            operation: "read fact \(key)"
        ) { $0.text(0) }
    }

    /// Every fact about `subject`, by key.
    public func facts(subject: String) throws -> [Fact] {
        try validate(subject, as: "subject")
        return try connection.query(
            "SELECT key, value, updated_at FROM facts WHERE subject = ?1 ORDER BY key", [.text(subject)],
            operation: "list facts of \(subject)"
        ) { Fact(key: $0.text(0), value: $0.text(1), updatedAt: Clock.date($0.int64(2))) }
    }

    /// Removes fact `key` about `subject`; returns whether it was stored.
    @discardableResult
    public func removeFact(subject: String, key: String) async throws -> Bool {
        try validate(subject, as: "subject")
        try validate(key, as: "fact key")
        return try await transaction("remove fact \(key)") { tx in
            try tx.run(
                "DELETE FROM facts WHERE subject = ?1 AND key = ?2", [.text(subject), .text(key)],
                operation: "remove fact \(key)") > 0
        }
    }
}

extension WriteTransaction {
    /// Unhops the parked steps of `subject` that wait for a session (``WakeCondition/sessionStored``),
    /// with the output `{"userID": …}`; returns their runs' ids.
    @discardableResult
    func unhopLoginSteps(subject: String, userID: String, operation: String) throws -> [Int64] {
        try endParkedSteps(
            subject: subject, wakeOn: .sessionStored, kind: .unhop, value: ["userID": userID], operation: operation)
    }

    /// Ends with a re-route the parked steps of `subject` that last only while a session is stored.
    @discardableResult
    func rerouteSessionSteps(subject: String, reason: String, operation: String) throws -> [Int64] {
        try endParkedSteps(
            subject: subject, wakeOn: .sessionRemoved, kind: .reroute, value: ["reason": reason], operation: operation)
    }

    /// Ends the parked steps of `subject` that `wakeOn` ends, with a `kind` entry holding `value`
    /// as JSON; returns their runs' ids.
    fileprivate func endParkedSteps(
        subject: String, wakeOn: WakeCondition, kind: HistoryKind, value: [String: String], operation: String
    ) throws -> [Int64] {
        let waiting = try connection.query(
            HopStore.wakingRunsSQL, [.text(subject), .text(wakeOn.rawValue)], operation: operation, RunRecord.init(row:)
        )
        let json = String(decoding: try JSONEncoder().encode(value), as: UTF8.self)
        for run in waiting {
            guard let token = run.currentToken else { continue }
            try endStep(RunHead(run), token: token, kind: kind, value: json, operation: operation)
        }
        return waiting.map(\.id)
    }
}

extension HopStore {
    /// The runs of subject `?1` parked on a step that the stored change `?2` ends, oldest first,
    /// read through the index of waking runs (`runs_waking`): never the subject's other runs.
    static let wakingRunsSQL = """
        SELECT \(RunRecord.columns) FROM runs
        WHERE subject = ?1 AND wake_on = ?2 AND status = \(RunStatus.parked.sql)
        ORDER BY id
        """
}
