import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Testing

/// The engine's paths that only a failing database takes (an I/O error, a lost connection):
/// whatever fails, no run stays held by an engine that is not executing it.
@Suite struct DatabaseFailureTests {
    /// A resume claims a batch of runs, then reads their histories. When the database fails
    /// that read, the batch goes back at once, and the next look (this engine's or another's)
    /// resumes it. Before, the runs stayed held by this live engine, which was not executing
    /// them, until their leases expired (a minute here): no engine resumed them meanwhile.
    @Test(arguments: TestBackend.all)
    func aResumeWhoseHistoryReadFailsLetsItsRunsGoAtOnce(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.open(folder)
        // Runs in flight as an engine that stopped left them: running, held by none.
        var ids: [Int64] = []
        for subject in ["a", "b", "c"] {
            let started = try await database.startRun(
                flow: "startup", subject: subject, version: "1", owner: nil, until: nil, durability: .now)
            ids.append(started.run.id)
        }
        let storage = FaultyStorage(database)
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))

        storage.fail("histories(runIDs:)")
        await #expect(throws: HopError.self) { try await engine.resumeAll() }
        #expect(storage.pendingFaults("histories(runIDs:)") == 0, "the resume did not read the histories")
        for id in ids {
            let run = try #require(try await database.run(id: id))
            #expect(run.owner == nil, "run \(id) stays held by \(run.owner ?? "?"), which does not execute it")
        }

        #expect(try await engine.resumeAll() == ids.count)
        for id in ids {
            #expect(try await engine.settled(runID: id)?.status == .parked, "run \(id) did not reach onboarding")
        }
    }

    /// The same for one run, claimed by its own execution (a start that finds the subject's run
    /// unfinished): the execution stops, and its run goes back at once.
    @Test(arguments: TestBackend.all)
    func anExecutionWhoseHistoryReadFailsLetsItsRunGoAtOnce(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let database = try await backend.open(folder)
        let id = try await database.startRun(
            flow: "startup", subject: "default", version: "1", owner: nil, until: nil, durability: .now
        ).run.id
        let storage = FaultyStorage(database)
        let engine = try await startupEngine(
            folder, storage: storage, configuration: .init(leaseDuration: .seconds(60)))

        storage.fail("history(runID:limit:)")
        #expect(try await engine.start("startup").id == id)
        let stopped = try await engine.settled(runID: id)
        #expect(storage.pendingFaults("history(runID:limit:)") == 0, "the execution did not read the history")
        #expect(stopped?.status == .running)
        #expect(stopped?.owner == nil, "the run stays held by \(stopped?.owner ?? "?"), which does not execute it")

        #expect(try await engine.resumeAll() == 1)
        #expect(try await engine.settled(runID: id)?.status == .parked, "the run did not reach onboarding")
    }
}
