import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

extension HopStore {
    /// A write that changes the run, then fails: what a failure half-way through a write looks like.
    fileprivate func writeThenFail(runID: Int64) async throws {
        try await transaction("write then fail") { tx in
            try tx.append(runID: runID, .decision, step: "half-written", value: "1", operation: "write then fail")
            throw tx.refuse(.refused, "write then fail", "failing on purpose")
        }
    }
}

@Suite struct GroupCommitTests {
    @Test func writesArrivingTogetherShareTransactionsAndAFailingOneIsUndoneAlone() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        var runs: [Int64] = []
        for index in 0..<200 {
            runs.append(try await store.startRun(flow: "f", subject: "s\(index)", version: "1").run.id)
        }
        let before = await store.commitStatistics

        let outcomes = try await withThrowingTaskGroup(of: (Int64, Bool).self) { group in
            for (index, runID) in runs.enumerated() {
                group.addTask {
                    if index % 10 == 3 {
                        do {
                            try await store.writeThenFail(runID: runID)
                            return (runID, true)
                        } catch let error as HopError where error.code == .refused {
                            return (runID, false)
                        }
                    }
                    try await store.recordDecision(runID: runID, name: "good", value: "\(index)")
                    return (runID, true)
                }
            }
            return try await group.reduce(into: [Int64: Bool]()) { $0[$1.0] = $1.1 }
        }

        for (index, runID) in runs.enumerated() {
            let history = try await store.history(runID: runID)
            if index % 10 == 3 {
                #expect(outcomes[runID] == false)
                #expect(history.isEmpty, "the failed write of run \(runID) left \(history)")
            } else {
                #expect(outcomes[runID] == true)
                #expect(history.map(\.step) == ["good"] && history.first?.value == "\(index)")
            }
        }
        let after = await store.commitStatistics
        #expect(after.writes - before.writes == 180)
        #expect(after.transactions - before.transactions < 180, "no two writes shared a transaction")
        #expect(try await store.integrityCheck() == ["ok"])
    }
}
