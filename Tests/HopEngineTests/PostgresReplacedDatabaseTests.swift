import Foundation
import HopEngine
import HopPostgres
import HopStore
import HopTestSupport
import Testing

/// An operator restores a backup of the database (`pg_dump`, then `pg_restore --clean`) without
/// stopping the engines first. PostgreSQL keeps their connections: before, an engine went on
/// writing its runs as it knew them over the restored ones, whose histories end earlier. Now a
/// store that finds Hop's tables created again since it opened the database writes nothing more
/// to its runs and says so (`.replaced`), as a store whose file was replaced does.
@Suite struct PostgresReplacedDatabaseTests {
    static let owner = "A#0123456789abcdef"  // no liveness lock of this store's: never waited for
    static var lease: Date { Date().addingTimeInterval(600) }

    /// The entries of run `runID` in the test's database, read with psql.
    static func entries(of runID: Int64, in folder: TemporaryDirectory) async throws -> String {
        try await TestDatabases.shared.psql("SELECT count(*) FROM history WHERE run_id = \(runID)", in: folder)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test(.enabled(if: PostgresProcessTests.available))
    func aStoreThatOpenedTheDatabaseBeforeARestoreWritesNothingMoreToItsRuns() async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let writer = try await PostgresStore.open(url: url)
        let idle = try await PostgresStore.open(url: url)
        let run = try await writer.startRun(
            flow: "startup", subject: "alice", version: "1", owner: Self.owner, until: Self.lease, durability: .now
        ).run
        try await writer.record(
            [.hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil)], runID: run.id,
            owner: Self.owner, durability: .now)
        let backup = try await TestDatabases.shared.dump(in: folder)
        let inBackup = try await Self.entries(of: run.id, in: folder)

        // What an operator does to the tables every day changes nothing: the same tables.
        for statement in ["VACUUM FULL runs", "VACUUM FULL history", "ANALYZE"] {
            try await TestDatabases.shared.psql(statement, in: folder)
        }
        try await writer.record(
            [.decision(name: "first-use", value: "true")], runID: run.id, owner: Self.owner, durability: .now)
        let later = try await writer.startRun(
            flow: "startup", subject: "bob", version: "1", owner: Self.owner, until: Self.lease, durability: .now
        ).run
        try await idle.checkSchema()

        try await TestDatabases.shared.restore(backup, in: folder)
        #expect(try await Self.entries(of: run.id, in: folder) == inBackup)

        // A run in the backup: the write changes nothing, and the store says why.
        let refused = await #expect(throws: HopError.self) {
            try await writer.record(
                [.decision(name: "first-use", value: "true")], runID: run.id, owner: Self.owner, durability: .now)
        }
        #expect(refused?.code == .replaced, "\(String(describing: refused))")
        #expect("\(String(describing: refused))".contains("were dropped and created again"))
        #expect(try await Self.entries(of: run.id, in: folder) == inBackup)
        // A run the backup does not have: the same, not "not found".
        let missing = await #expect(throws: HopError.self) {
            try await writer.record(
                [.hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil)], runID: later.id,
                owner: Self.owner, durability: .now)
        }
        #expect(missing?.code == .replaced, "\(String(describing: missing))")
        // From then on the engine's watch stops the engine at its next poll.
        let watched = await #expect(throws: HopError.self) { try await writer.changeVersion() }
        #expect(watched?.code == .replaced)

        // A store that wrote nothing since finds it at its look at the schema, then at every poll.
        #expect(try await idle.changeVersion() >= 0)
        let looked = await #expect(throws: HopError.self) { try await idle.checkSchema() }
        #expect(looked?.code == .replaced, "\(String(describing: looked))")
        #expect((await #expect(throws: HopError.self) { try await idle.changeVersion() })?.code == .replaced)

        // The restored database itself is fine: a store opened now carries the run on.
        let fresh = try await PostgresStore.open(url: url)
        try await fresh.checkSchema()
        try await fresh.record(
            [.decision(name: "first-use", value: "true")], runID: run.id, owner: Self.owner, durability: .now)
        #expect(try await fresh.history(runID: run.id, limit: nil).count == (Int(inBackup) ?? 0) + 1)
        await fresh.close()
        await idle.close()
        await writer.close()
    }
}
