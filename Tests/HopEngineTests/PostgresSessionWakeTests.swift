import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import Testing

/// A step that parks until a session is stored (a login) or removed (a logout, an expiry), on
/// PostgreSQL, while another process stores or removes that session at the same moment.
@Suite struct PostgresSessionWakeTests {
    /// One engine parks runs at login while `hopctl session login` (another store, so another
    /// pool) stores each subject's session at the same moment, 200 times. Every run must be
    /// unhopped: by the login when the park committed first, by the park itself when the login
    /// did. Before, under READ COMMITTED, each transaction could miss the other's uncommitted
    /// write (the park read no session, the login found no parked run), and the run stayed
    /// parked at login with a session stored, for good: about a quarter of the 200 here, and
    /// `hop-demo` in SystemdTests, 2 of 12 runs, waited for "run 1 is completed" for 90 s.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aLoginAtTheMomentARunParksAtLoginAlwaysWakesIt() async throws {
        let stuck = try await Self.race(parkingUntil: .sessionStored, sessionsBefore: false) { store, subject in
            try await store.storeSession(subject: subject, userID: "alice", token: Token.random(), expiresAt: nil)
        }
        #expect(stuck.isEmpty, "parked at login with a session stored: \(stuck.count) of 200")
    }

    /// The same with a logout (`hopctl session logout`) at the moment a run parks in a step that
    /// lasts while the session is stored (a main step): every run is re-routed. Before, about a
    /// quarter stayed parked in main with no session.
    @Test(.enabled(if: PostgresProcessTests.available))
    func aLogoutAtTheMomentARunParksInMainAlwaysReroutesIt() async throws {
        let stuck = try await Self.race(parkingUntil: .sessionRemoved, sessionsBefore: true) { store, subject in
            _ = try await store.deleteSession(subject: subject, userID: nil)
        }
        #expect(stuck.isEmpty, "parked in main with no session: \(stuck.count) of 200")
    }

    /// The same with each session expiring (an engine's watch removes it) at the moment its run
    /// parks in main: subject `userN`'s session ends N ms after the others' first, and the
    /// expiry removes the sessions due by then. Every run is re-routed.
    @Test(.enabled(if: PostgresProcessTests.available))
    func anExpiryAtTheMomentARunParksInMainAlwaysReroutesIt() async throws {
        let base = Date().addingTimeInterval(600)
        @Sendable func ending(_ subject: String) -> Date {
            base.addingTimeInterval(Double(Int(subject.dropFirst(4)) ?? 0) / 1000)
        }
        let stuck = try await Self.race(parkingUntil: .sessionRemoved, sessionsBefore: true, endingAt: ending) {
            store, subject in
            _ = try await store.expireSessions(now: ending(subject))
        }
        #expect(stuck.isEmpty, "parked in main with no session: \(stuck.count) of 200")
    }

    /// Runs of 200 subjects, each parked (by store A, as an engine) until `condition`, while store
    /// B applies `change` to the same subject, 20 subjects at a time; with `sessionsBefore`, each
    /// subject has a session first, which ends at `ending(subject)`. Returns the subjects whose
    /// run is still parked.
    static func race(
        parkingUntil condition: WakeCondition, sessionsBefore: Bool, endingAt ending: (String) -> Date? = { _ in nil },
        change: @escaping @Sendable (PostgresStore, String) async throws -> Void
    ) async throws -> [String] {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let engine = try await PostgresStore.open(url: url)
        let other = try await PostgresStore.open(url: url)
        let until = Date().addingTimeInterval(600)
        let owner = "A#0123456789abcdef"  // no liveness lock of this store: not waited for
        let subjects = (0..<200).map { "user\($0)" }
        var runs: [String: Int64] = [:]
        for subject in subjects {
            if sessionsBefore {
                try await engine.storeSession(
                    subject: subject, userID: "alice", token: Token.random(), expiresAt: ending(subject))
            }
            let run = try await engine.startRun(
                flow: "startup", subject: subject, version: "1", owner: owner, until: until, durability: .now
            ).run
            runs[subject] = run.id
        }
        let step = condition == .sessionStored ? "login" : "main"
        for batch in stride(from: 0, to: subjects.count, by: 20) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for subject in subjects[batch..<(batch + 20)] {
                    let runID = try #require(runs[subject])
                    group.addTask {
                        try await engine.record(
                            [.hop(step: step, from: nil, parks: true, wakeOn: condition, deadline: nil)],
                            runID: runID, owner: owner, durability: .now)
                    }
                    group.addTask { try await change(other, subject) }
                }
                try await group.waitForAll()
            }
        }
        var stuck: [String] = []
        for subject in subjects {
            let runID = try #require(runs[subject])
            let run = try #require(try await engine.run(id: runID))
            if run.status == .parked { stuck.append(subject) }
        }
        await engine.close()
        await other.close()
        return stuck
    }
}
