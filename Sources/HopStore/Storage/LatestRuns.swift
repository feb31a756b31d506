/// The statements that list the newest run of each flow and subject (`hopctl status`), the same
/// for both backends: one for each combination of filters, each reading the index that serves it,
/// so that a filter never costs a read of every run, and a listing stops at its limit rather than
/// after grouping every run.
package enum LatestRuns {
    /// The statement for the filters given, selecting `runColumns` (each backend's own list for its
    /// run records), its parameters numbered after `marker` (`?` for SQLite, `$` for PostgreSQL):
    /// the limit first, then those of ``arguments(flow:subject:status:limit:)``.
    ///
    /// - An unfinished status: the runs with it (from the index of unfinished runs) that no newer
    ///   run of their flow and subject follows.
    /// - A subject: its newest run of each flow (or of the flow given), one search of the index by
    ///   flow, subject and id each. The index leads with the flow and PostgreSQL has no skip scan:
    ///   `subject = $2` alone read the whole table there.
    /// - Otherwise, a finished status: the newest run of each flow and subject, then those with
    ///   the status (no index holds finished runs by status: this one reads every run of the flow,
    ///   or every run).
    /// - Otherwise: the first `limit` flows and subjects, found one after another in the index by
    ///   flow, subject and id (``pairsSQL(flow:)``), and the newest run of each.
    package static func sql(flow: Bool, subject: Bool, status: RunStatus?, marker: String, runColumns: String) -> String
    {
        // Placeholders in the order of `arguments`: the limit, the flow, the subject, a status.
        let limit = marker + "1"
        let flowValue = flow ? marker + "2" : nil
        let subjectValue = subject ? marker + (flow ? "3" : "2") : nil
        let statusValue = marker + String(2 + (flow ? 1 : 0) + (subject ? 1 : 0))
        let order = " ORDER BY flow, subject LIMIT " + limit
        if let status, status.isUnfinished {
            // The status's literal, not a parameter: a partial index serves only a statement whose
            // text implies its condition.
            let unfinished = status == .parked ? RunStatus.parked.condition : RunStatus.running.condition
            let filter =
                unfinished + (flowValue.map { " AND flow = " + $0 } ?? "")
                + (subjectValue.map { " AND subject = " + $0 } ?? "")
                + " AND NOT EXISTS (SELECT 1 FROM runs n WHERE n.flow = r.flow AND n.subject = r.subject AND n.id > r.id)"
                + order
            return "SELECT \(runColumns) FROM runs r WHERE \(filter)"
        }
        var flowsTable = ""
        let filter: String
        if let subjectValue {
            // One search of the index by flow, subject and id for the subject's newest run: of the
            // flow given, or of each flow in turn.
            let newest: String
            if let flowValue {
                newest = "SELECT max(id) FROM runs WHERE flow = " + flowValue + " AND subject = " + subjectValue
            } else {
                flowsTable = HopStore.flowsSQL
                newest =
                    "SELECT (SELECT max(n.id) FROM runs n WHERE n.flow = flows.flow AND n.subject = " + subjectValue
                    + ") FROM flows WHERE flows.flow IS NOT NULL"
            }
            filter = "id IN (" + newest + ")" + (status == nil ? "" : " AND status = " + statusValue) + order
        } else if status == nil {
            return pairsSQL(flow: flowValue) + " SELECT \(runColumns) FROM runs WHERE id IN ("
                + "SELECT (SELECT max(m.id) FROM runs m WHERE m.flow = listed.flow AND m.subject = listed.subject)"
                + " FROM (SELECT flow, subject FROM pairs LIMIT " + limit + ") listed) ORDER BY flow, subject"
        } else {
            let newest =
                "SELECT max(id) FROM runs" + (flowValue.map { " WHERE flow = " + $0 } ?? "") + " GROUP BY flow, subject"
            filter = "id IN (" + newest + ") AND status = " + statusValue + order
        }
        return "\(flowsTable) SELECT \(runColumns) FROM runs WHERE \(filter)"
    }

    /// A common table `pairs` of the flows and subjects that have runs (of the flow given as
    /// `flow`, a placeholder), in order, found by searches of the index by flow, subject and id:
    /// the first pair, then the next subject of the same flow, or the first of the next flow, until
    /// there is none. Read only as far as the statement needs: a listing of 1,000 pairs searches
    /// about 3,000 times whatever the number of runs each has (grouping every run by flow and
    /// subject read them all: 0.13 s at 1,000,000 runs of 1,000 subjects).
    static func pairsSQL(flow: String?) -> String {
        // Built by concatenation: `flow` is a placeholder (`?2`, `$2`), never a value.
        let next =
            "(SELECT n.id FROM runs n WHERE n.flow = p.flow AND n.subject > p.subject ORDER BY n.subject LIMIT 1)"
        let nextFlow = "(SELECT n.id FROM runs n WHERE n.flow > p.flow ORDER BY n.flow, n.subject LIMIT 1)"
        let seed =
            "SELECT flow, subject FROM runs" + (flow.map { " WHERE flow = " + $0 } ?? "")
            + " ORDER BY flow, subject LIMIT 1"
        let step = flow == nil ? "coalesce(" + next + ", " + nextFlow + ")" : next
        return "WITH RECURSIVE pairs(flow, subject) AS (SELECT flow, subject FROM (" + seed + ") seed"
            + " UNION ALL SELECT r.flow, r.subject FROM pairs p JOIN runs r ON r.id = " + step + ")"
    }

    /// The values of ``sql(flow:subject:status:marker:runColumns:)``'s parameters: the limit, then the flow,
    /// the subject and a finished status, those given, as text.
    package static func arguments(
        flow: String?, subject: String?, status: RunStatus?, limit: Int
    ) -> (limit: Int64, texts: [String]) {
        var texts = [flow, subject].compactMap { $0 }
        if let status, !status.isUnfinished { texts.append(status.rawValue) }
        return (Int64(max(0, limit)), texts)
    }
}
