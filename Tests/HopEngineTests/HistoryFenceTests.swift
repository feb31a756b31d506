import Foundation
import HopStore
import HopTestSupport
import Testing

/// The engine executing a run names, with each write, the last history entry it read or
/// recorded; the store refuses the write, changing nothing, unless the run's history ends
/// there. (The engine's reaction, executing the run again from the database, is tested with a
/// real failover in `PostgresFailoverTests`.)
@Suite struct HistoryFenceTests {
    @Test(arguments: TestBackend.all)
    func aWriteThatFollowsAnotherEntryThanTheLastIsRefusedAndChangesNothing(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.record(
            .hop(step: "splash", from: nil, parks: false, wakeOn: nil, deadline: nil),
            runID: run.id, following: 0)
        let token = try #require(hop.token)
        #expect(hop.seq == 1)

        // Behind the history (it holds an entry the writer never saw) and ahead of it (the
        // writer's last entries are not there), alone and as the first of several writes.
        for following: Int64 in [0, 3] {
            for writes: [RunWrite] in [
                [.decision(name: "isFirstUse(onboarding)", value: "true")],
                [.unhop(token: token, output: nil), .markUsed(feature: "onboarding")],
                [.unhop(token: token, output: nil), .decision(name: "a", value: "1"), .complete],
            ] {
                let refused = await #expect(throws: HopError.self) {
                    try await store.record(writes, runID: run.id, owner: nil, following: following, durability: .now)
                }
                #expect(refused?.code == .refused)
                #expect(
                    refused?.reason.contains("ends at entry 1, not at entry \(following)") == true,
                    "\(refused.map { "\($0)" } ?? "")")
            }
        }
        #expect(try await store.history(runID: run.id).map(\.seq) == [1])
        #expect(try await store.run(id: run.id)?.currentToken == token)
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding"))

        // Following the last entry: written, and each later write of the batch follows the one before.
        let entries = try await store.record(
            [.unhop(token: token, output: nil), .markUsed(feature: "onboarding"), .decision(name: "a", value: "1")],
            runID: run.id, owner: nil, following: 1, durability: .now)
        #expect(entries.map(\.seq) == [2, 3, 4])
        #expect(try await store.record(.complete, runID: run.id, following: 4).seq == 5)
        #expect(try await store.run(id: run.id)?.status == .completed)
    }
}
