import Foundation
import HopStore
import HopTestSupport
import Synchronization
import Testing

/// What `hopctl copy` stands on: a snapshot handed out a part at a time stays one snapshot while
/// other clients write between its parts, and a restore written a part at a time is still all or
/// nothing.
@Suite struct SnapshotPartsTests {
    private struct Stop: Error, Equatable {}

    /// The parts a snapshot handed out, kept as they came.
    private final class Taken: Sendable {
        private let parts = Mutex<[SnapshotPart]>([])

        func add(_ part: SnapshotPart) -> Int {
            parts.withLock {
                $0.append(part)
                return $0.count
            }
        }

        var all: [SnapshotPart] { parts.withLock { $0 } }

        /// How many rows of each table, by the table's case name.
        var counts: [String: Int] {
            var counts: [String: Int] = [:]
            for part in all {
                let name =
                    switch part {
                    case .runs: "runs"
                    case .history: "history"
                    case .firstUse: "firstUse"
                    case .sessions: "sessions"
                    case .facts: "facts"
                    }
                counts[name, default: 0] += part.count
            }
            return counts
        }
    }

    /// Another store writes a flag, a session and facts while the snapshot hands out its first
    /// parts: none of it is in the snapshot, though all of it is committed before the snapshot
    /// reads those tables; every history part is full but the last.
    @Test(arguments: TestBackend.all) func aSnapshotStaysOneSnapshotWhileOthersWriteBetweenItsParts(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let source = try await backend.open(folder)
        let laps = 3000  // 6,001 entries: two history parts
        try await LongHistoryTests.loopRun(laps: laps, in: source)
        let writer = try await backend.open(folder)
        let taken = Taken()
        try await source.snapshot { part in
            switch taken.add(part) {
            case 1:
                try await writer.markUsed(subject: "s", feature: "onboarding")
                try await writer.setFact(subject: "s", key: "during", value: "the runs")
                _ = try await writer.storeSession(subject: "s", userID: "u", token: "secret", expiresAt: nil)
            case 2:
                try await writer.setFact(subject: "s", key: "during", value: "the history")
            default: break
            }
            try await writer.makeDurable()
        }
        #expect(taken.counts == ["runs": 1, "history": 2 * laps + 1], "\(taken.counts)")
        if case .history(let first) = taken.all[1] {
            #expect(first.count == SnapshotPart.rowsPerPart && first.first?.seq == 1)
        } else {
            Issue.record("the second part is not history")
        }
        // The writes took: a snapshot taken now has them.
        let after = Taken()
        try await source.snapshot { part in _ = after.add(part) }
        #expect(after.counts["firstUse"] == 1 && after.counts["sessions"] == 1 && after.counts["facts"] == 1)
    }

    /// An error of the code a snapshot hands its parts to comes out of the snapshot as it is (not
    /// as the database's), and the store reads and writes on afterwards.
    @Test(arguments: TestBackend.all) func aSnapshotEndedByItsTakerThrowsTheTakersErrorAndLeavesTheStoreAsItWas(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        try await LongHistoryTests.loopRun(laps: 10, in: store)
        await #expect(throws: Stop.self) { try await store.snapshot { _ in throw Stop() } }
        try await store.markUsed(subject: "s", feature: "onboarding")
        try await store.makeDurable()
        #expect(try await store.isFirstUse(subject: "s", feature: "onboarding") == false)
    }

    /// A restore whose parts stop with an error after some were written (a source's read that
    /// failed) leaves the database empty (a second restore into it is taken) and throws that error
    /// as it is; a part handed in after a restore ended is refused.
    @Test(arguments: TestBackend.all) func aRestoreIsAllOrNothingAPartAtATime(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let target = try await backend.open(folder)
        let run = RunRecord(id: 7, flow: "loop", subject: "s", flowVersion: "1", status: .running, currentStep: "tick")
        let at = Date(timeIntervalSince1970: 1_700_000_000)
        let hop = HistoryEntry.recorded(
            runID: 7, seq: 1, kind: .hop, step: "tick", token: "t0", value: nil, at: at)
        let sourceFailed = HopError(.ioFailure, "the source's disk failed")
        let thrown = await #expect(throws: HopError.self) {
            try await target.restore { write in
                try await write(.runs([run]))
                try await write(.history([hop]))
                try await write(.facts([(subject: "s", fact: .stored(key: "k", value: "v", updatedAt: at))]))
                throw sourceFailed
            }
        }
        #expect(thrown?.reason == sourceFailed.reason && thrown?.code == .ioFailure, "\(String(describing: thrown))")
        #expect(try await target.run(id: 7) == nil)
        #expect(try await target.fact(subject: "s", key: "k") == nil)

        let kept = Mutex<(@Sendable (SnapshotPart) async throws -> Void)?>(nil)
        try await target.restore { write in
            try await write(.runs([run]))
            try await write(.history([hop]))
            kept.withLock { $0 = write }
        }
        #expect(try await target.history(runID: 7).map(\.seq) == [1])
        let late = try #require(kept.withLock { $0 })
        let refused = await #expect(throws: HopError.self) {
            try await late(.facts([(subject: "s", fact: .stored(key: "k", value: "v", updatedAt: at))]))
        }
        #expect(refused?.code == .refused, "\(String(describing: refused))")
        #expect(try await target.fact(subject: "s", key: "k") == nil)
    }
}
