import HopPostgres
import HopStore
import HopTestSupport
import Testing

/// What PostgreSQL's statements read on a large database: each plan made on a database of a few
/// thousand runs with its statistics taken (the planner reads a near-empty table whole, whatever
/// its indexes) and whole-table reads priced out. (The SQLite statements' plans: RunHistoryTests.)
@Suite struct PostgresPlanTests {
    /// `hopctl status`'s statements: a subject without a flow is searched flow by flow (the index
    /// leads with the flow, and PostgreSQL has no skip scan: `subject = $2` alone read every run,
    /// 40–60 ms at 1,000,000 runs against 0.6 ms); a running or parked listing reads an index of
    /// unfinished runs; a listing without a status or subject walks the pairs of flow and subject.
    @Test(.enabled(if: PostgresProcessTests.available)) func statusListingsSearchTheirIndexes() async throws {
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: try await TestBackend.postgres.location(folder))
        defer { Task { await store.close() } }
        // 20,000 finished runs, of 4 flows and 5,000 subjects; then the planner's statistics.
        try await TestDatabases.shared.psql(
            """
            INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at)
            SELECT 'flow-' || (i % 4), 'subject-' || (i % 5000), '1', 'completed', i, i FROM generate_series(1, 20000) i;
            ANALYZE runs;
            """, in: folder)
        for flow in [false, true] {
            for subject in [false, true] {
                for status in [nil] + RunStatus.allCases {
                    let what = "flow \(flow), subject \(subject), status \(status?.rawValue ?? "-")"
                    let plan = try await store.explain(
                        PostgresStore.latestRunsSQL(flow: flow, subject: subject, status: status),
                        PostgresStore.latestRunsValues(
                            flow: flow ? "startup" : nil, subject: subject ? "kiosk" : nil, status: status, limit: 10)
                    ).joined(separator: "\n")
                    #expect(!plan.contains("Seq Scan"), "\(what):\n\(plan)")
                    if let status, status.isUnfinished {
                        // Either index of unfinished runs (by status and flow, or by flow and subject).
                        #expect(plan.contains("Index Scan using runs_unfinished"), "\(what):\n\(plan)")
                    } else if subject && !flow {
                        #expect(plan.contains("Index Cond: ((flow = "), "\(what):\n\(plan)")
                    } else if !subject && status == nil {
                        // The pairs of flow and subject one search after another, not every run
                        // grouped (0.16 s against 35 ms at 1,000,000 runs of 1,000 subjects).
                        #expect(plan.contains("Recursive Union"), "\(what):\n\(plan)")
                        #expect(
                            plan.contains("Index Cond: ((flow = p.flow) AND (subject > p.subject))"),
                            "\(what):\n\(plan)")
                        #expect(!plan.contains("GroupAggregate"), "\(what):\n\(plan)")
                    }
                }
            }
        }
    }

    /// The watch's look for engines that are gone, every second of every engine: the owners
    /// one index search after another, not every owned run read and sorted (140–200 ms at 40,000
    /// runs in flight, against 3–5 ms). The plan is made on 20,000 running runs of 4 owners.
    @Test(.enabled(if: PostgresProcessTests.available)) func theLookForEnginesThatAreGoneWalksTheOwners() async throws {
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: try await TestBackend.postgres.location(folder))
        defer { Task { await store.close() } }
        try await TestDatabases.shared.psql(
            """
            INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at, owner, last_owner, lease_expires_at)
            SELECT 'startup', 'subject-' || i, '1', 'running', i, i, o, o, i
            FROM generate_series(1, 20000) i, LATERAL (SELECT 'engine#' || lpad(to_hex(i % 4), 16, '0') AS o) AS owner;
            ANALYZE runs;
            """, in: folder)
        let plan = try await store.explain(
            PostgresStore.deadOwnersSQL, [.text("engine#00000000000000ff"), .int(0)]
        ).joined(separator: "\n")
        #expect(plan.contains("Recursive Union"), "\(plan)")
        #expect(!plan.contains("Seq Scan on runs") && !plan.contains("Bitmap Heap Scan on runs"), "\(plan)")
        #expect(!plan.contains("Sort"), "\(plan)")
    }

    /// An engine's look at what comes due next (``PostgresStore/nextDueSQL``), once a second of
    /// every idle engine: the first entry of each partial index (deadlines of parked runs, session
    /// expiries), not every parked run or session read. Made on 20,000 parked runs with
    /// deadlines and 5,000 sessions with expiries.
    @Test(.enabled(if: PostgresProcessTests.available)) func theLookAtWhatComesDueReadsTheFirstOfEachIndex()
        async throws
    {
        let folder = try TemporaryDirectory()
        let store = try await PostgresStore.open(url: try await TestBackend.postgres.location(folder))
        defer { Task { await store.close() } }
        try await TestDatabases.shared.psql(
            """
            INSERT INTO runs (flow, subject, flow_version, status, created_at, updated_at, current_step, wake_at)
            SELECT 'startup', 'subject-' || i, '1', 'parked', i, i, 'wait', 1000000 + i FROM generate_series(1, 20000) i;
            INSERT INTO sessions (subject, user_id, token, created_at, expires_at)
            SELECT 'subject-' || i, 'user', 'token-' || i, i, 1000000 + i FROM generate_series(1, 5000) i;
            ANALYZE runs; ANALYZE sessions;
            """, in: folder)
        let plan = try await store.explain(PostgresStore.nextDueSQL, []).joined(separator: "\n")
        #expect(plan.contains("Index Scan using runs_by_wake_at"), "\(plan)")
        #expect(
            plan.contains("Index Only Scan using sessions_by_expiry")
                || plan.contains("Index Scan using sessions_by_expiry"), "\(plan)")
        #expect(!plan.contains("Seq Scan") && !plan.contains("Bitmap Heap Scan") && !plan.contains("Sort"), "\(plan)")
        #expect(plan.contains("Limit"), "not the first entry of an index:\n\(plan)")
    }
}
