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

/// Coalesced writes: applied at once and seen by the store that wrote them, durable with the
/// next durable write or `commitDelay` later, undone alone when they fail.
@Suite struct CoalescedWriteTests {
    /// A store whose coalesced writes wait for a durable write (the delay is far longer than a test).
    static func holdingStore(_ folder: TemporaryDirectory) async throws -> HopStore {
        var options = HopStore.Options()
        options.commitDelay = .seconds(600)
        return try await HopStore.open(path: folder.database, options: options)
    }

    /// Another connection to the same file: what another process sees.
    static func elsewhere(_ folder: TemporaryDirectory) async throws -> HopStore {
        try await HopStore.open(path: folder.database, options: HopStore.Options(migrate: false))
    }

    @Test func aCoalescedWriteIsSeenHereAtOnceAndElsewhereWithTheNextDurableWrite() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        let other = try await Self.elsewhere(folder)
        let before = await store.commitStatistics

        try await store.recordDecision(runID: run.id, name: "a", value: "1", durability: .coalesced)
        try await store.markUsed(runID: run.id, feature: "onboarding", durability: .coalesced)
        #expect(try await store.history(runID: run.id).map(\.kind) == [.decision, .effect])
        #expect(try await store.isFirstUse(subject: "s", feature: "onboarding") == false)
        #expect(try await other.history(runID: run.id).isEmpty, "another connection saw an uncommitted write")
        #expect(try await other.isFirstUse(subject: "s", feature: "onboarding"))

        try await store.recordHop(runID: run.id, step: "next")
        #expect(try await other.history(runID: run.id).map(\.kind) == [.decision, .effect, .hop])
        #expect(try await other.isFirstUse(subject: "s", feature: "onboarding") == false)
        let after = await store.commitStatistics
        #expect(after.transactions - before.transactions == 1, "the hop did not carry the coalesced writes")
        #expect(after.writes - before.writes == 3)
    }

    @Test func withNothingElseToCommitThemCoalescedWritesCommitWithinTheDelay() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)  // the default delay: 2 ms
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        let other = try await Self.elsewhere(folder)
        try await store.recordDecision(runID: run.id, name: "a", value: "1", durability: .coalesced)
        try await waitUntil("another connection sees the decision") {
            try await other.history(runID: run.id).count == 1
        }
    }

    @Test func makeDurableCommitsNowAndWaitUntilDurableReturnsOnceCommitted() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        let other = try await Self.elsewhere(folder)

        try await store.recordDecision(runID: run.id, name: "a", value: "1", durability: .coalesced)
        try await store.makeDurable()
        #expect(try await other.history(runID: run.id).count == 1)

        try await store.recordDecision(runID: run.id, name: "b", value: "2", durability: .coalesced)
        async let waited: Void = store.waitUntilDurable(runID: run.id)
        try await store.recordHop(runID: run.id, step: "next")  // commits it
        try await waited
        #expect(try await other.history(runID: run.id).map(\.step) == ["a", "b", "next"])
        try await store.makeDurable()  // nothing open: nothing to do
    }

    /// A store let go of while its commit delay runs (its coalesced writes committed by
    /// `makeDurable`, the delay's timer still set) leaves nothing behind once its thread ends.
    /// Before, the thread ended with the timer set: the timer's work held the thread's queue
    /// (through the executor it starts its task on) and the queue held the work, so both,
    /// with the thread's lock and condition, stayed in memory for the life of the process
    /// (found by `script/sanitize address`'s leak check).
    @Test func aStoreLetGoWhileItsCommitDelayRunsLeavesNothingBehind() async throws {
        let folder = try TemporaryDirectory()
        weak var flowExecutor: StoreExecutor.FlowExecutor?
        do {
            let store = try await Self.holdingStore(folder)  // a delay of 600 s
            flowExecutor = store.executor.flowExecutor
            let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
            try await store.recordDecision(runID: run.id, name: "a", value: "1", durability: .coalesced)
            try await store.makeDurable()
        }
        try await waitUntil("the let-go store's thread, queue and timer are gone", timeout: .seconds(20)) {
            flowExecutor == nil
        }
    }

    @Test func aCoalescedWriteThatRefusesFailsAloneAndChangesNothing() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        try await store.recordDecision(runID: run.id, name: "kept", value: "1", durability: .coalesced)
        // Refused before it changes anything: a stale token, a run held elsewhere.
        await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: "stale", owner: nil, durability: .coalesced)
        }
        await #expect(throws: HopError.self) {
            try await store.recordDecision(
                runID: run.id, name: "fenced", value: "2", owner: "another", durability: .coalesced)
        }
        try await store.recordDecision(runID: run.id, name: "after", value: "3", durability: .coalesced)
        try await store.makeDurable()
        let other = try await Self.elsewhere(folder)
        #expect(try await other.history(runID: run.id).map(\.step) == ["kept", "after"])
        #expect(try await other.integrityCheck() == ["ok"])
    }

    @Test func aCoalescedWriteThatFailsAfterChangingSomethingLosesTheOpenTransactionWhole() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        let neighbour = try await store.startRun(flow: "f", subject: "t", version: "1").run
        try await store.recordDecision(runID: neighbour.id, name: "durable", value: "0")
        try await store.recordDecision(runID: run.id, name: "kept", value: "1", durability: .coalesced)
        try await store.recordDecision(runID: neighbour.id, name: "pending", value: "1", durability: .coalesced)
        // Fails half-way, as a full disk or an I/O error would after its first statement.
        await #expect(throws: HopError.self) {
            try await store.write(.coalesced, "write then fail", runID: run.id) { tx in
                try tx.append(runID: run.id, .decision, step: "half-written", value: "2", operation: "write then fail")
                throw tx.refuse(.ioFailure, "write then fail", "failing on purpose")
            }
        }
        // Nothing of the open transaction holds: no half-written write, and the records before it
        // are lost with it, never kept without those after them.
        let other = try await Self.elsewhere(folder)
        #expect(try await other.history(runID: run.id).isEmpty)
        #expect(try await other.history(runID: neighbour.id).map(\.step) == ["durable"])
        #expect(try await store.history(runID: run.id).isEmpty)
        // Both runs resume from their durable history: released, and refused until claimed again.
        for id in [run.id, neighbour.id] {
            #expect(try await other.run(id: id)?.owner == nil)
            let refused = await #expect(throws: HopError.self) {
                try await store.recordDecision(runID: id, name: "again", value: "3", durability: .coalesced)
            }
            #expect(refused?.code == .ioFailure)
            await #expect(throws: HopError.self) { try await store.waitUntilDurable(runID: id) }
        }
        _ = try await store.claim(
            runIDs: [run.id, neighbour.id], owner: "engine", until: Date().addingTimeInterval(60))
        try await store.recordDecision(runID: run.id, name: "again", value: "3", owner: "engine")
        #expect(try await other.history(runID: run.id).map(\.step) == ["again"])
        #expect(try await other.integrityCheck() == ["ok"])
    }

    @Test func aRunCreatedInATransactionThatIsLostIsNeverReportedDurableAndItsIdIsNotHandedOutAgain() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let created = try await store.startRun(
            flow: "f", subject: "s", version: "1", owner: "engine", until: Date().addingTimeInterval(60),
            durability: .coalesced
        ).run
        await #expect(throws: HopError.self) {
            try await store.write(.coalesced, "write then fail", runID: created.id) { tx in
                try tx.append(
                    runID: created.id, .decision, step: "half-written", value: "2", operation: "write then fail")
                throw tx.refuse(.ioFailure, "write then fail", "failing on purpose")
            }
        }
        await #expect(throws: HopError.self) { try await store.waitUntilDurable(runID: created.id) }
        #expect(try await store.run(id: created.id) == nil)
        let next = try await store.startRun(flow: "f", subject: "s", version: "1").run
        #expect(next.id > created.id, "the lost run's id \(created.id) was handed out again")
    }

    @Test func aWriteOfARunWhoseCoalescedWritesWereLostIsRefusedUntilTheRunIsClaimedAgain() async throws {
        let folder = try TemporaryDirectory()
        let store = try await Self.holdingStore(folder)
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        await store.markLost([run.id])
        let refused = await #expect(throws: HopError.self) {
            try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: nil, durability: .now)
        }
        #expect(refused?.code == .ioFailure && "\(refused.map { "\($0)" } ?? "")".contains("lost"))
        #expect(try await store.history(runID: run.id).isEmpty)
        _ = try await store.claim(runID: run.id, owner: "engine", until: Date().addingTimeInterval(60))
        try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: "engine", durability: .now)
    }
}

extension HopStore {
    fileprivate func markLost(_ runIDs: [Int64]) { lostRuns.formUnion(runIDs) }
}

/// Records of a run that share one write transaction with other writes: each is fenced by the
/// run as it is at that moment (another write of the store in the same transaction, another
/// process between two transactions), and numbered after what stands (not after a record undone).
@Suite struct SharedTransactionRecordTests {
    /// A run held by `owner`, with its first step `first` in flight (durable); returns it and the step's token.
    static func heldRun(
        _ store: HopStore, owner: String, first: String = "first"
    ) async throws -> (run: RunRecord, token: String) {
        let run = try await store.startRun(flow: "f", subject: "s", version: "1").run
        _ = try await store.claim(runID: run.id, owner: owner, until: Date().addingTimeInterval(600))
        let hop = try await store.recordHop(runID: run.id, step: first, owner: owner)
        return (run, hop.token ?? "")
    }

    /// Gives run `runID` to another engine ('other') with a write of `store`'s that is not a record.
    static func handOver(_ runID: Int64, on store: HopStore, _ durability: WriteDurability) async throws {
        _ = try await store.write(durability, "hand the run over") { tx in
            try tx.run(
                "UPDATE runs SET owner = 'other', last_owner = 'other' WHERE id = ?1", [.integer(runID)],
                operation: "hand the run over")
        }
    }

    @Test func aWriteBetweenTwoRecordsOfARunInOneTransactionIsSeenByTheSecondsFence() async throws {
        let folder = try TemporaryDirectory()
        let store = try await CoalescedWriteTests.holdingStore(folder)
        let (run, _) = try await Self.heldRun(store, owner: "engine")
        let before = await store.commitStatistics
        try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: "engine", durability: .coalesced)
        // Another write of this store, in the same open transaction, gives the run to another engine.
        try await Self.handOver(run.id, on: store, .coalesced)
        let refused = await #expect(throws: HopError.self) {
            try await store.recordDecision(
                runID: run.id, name: "b", value: "2", owner: "engine", durability: .coalesced)
        }
        #expect(refused?.code == .refused, "the engine that lost the run wrote to it: \(refused.map { "\($0)" } ?? "")")
        #expect(await store.commitStatistics == before, "the writes did not share one open transaction")
        try await store.makeDurable()
        #expect(try await store.history(runID: run.id).map(\.step) == ["first", "a"])
    }

    /// Between two transactions another process may write (here another connection, as
    /// hopctl or a second engine would): nothing read in the first stands in the second.
    @Test(arguments: [WriteDurability.coalesced, .now])
    func aRunHandedOverByAnotherProcessBetweenTwoTransactionsRefusesTheNextRecord(
        durability: WriteDurability
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await CoalescedWriteTests.holdingStore(folder)
        let (run, _) = try await Self.heldRun(store, owner: "engine")
        try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: "engine", durability: durability)
        try await store.makeDurable()
        let other = try await CoalescedWriteTests.elsewhere(folder)
        try await Self.handOver(run.id, on: other, .now)
        let refused = await #expect(throws: HopError.self) {
            try await store.recordDecision(
                runID: run.id, name: "b", value: "2", owner: "engine", durability: durability)
        }
        #expect(refused?.code == .refused)
        try await store.makeDurable()
        #expect(try await other.history(runID: run.id).map(\.step) == ["first", "a"])
    }

    @Test func aRecordUndoneInATransactionLeavesTheNextEntryItsNumber() async throws {
        let folder = try TemporaryDirectory()
        let store = try await CoalescedWriteTests.holdingStore(folder)
        let (run, _) = try await Self.heldRun(store, owner: "engine")
        try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: "engine", durability: .coalesced)
        // Two writes as one, the second refused: the first is undone with it.
        await #expect(throws: HopError.self) {
            try await store.record(
                [.decision(name: "undone", value: "2"), .unhop(token: "stale", output: nil)], runID: run.id,
                owner: "engine", durability: .coalesced)
        }
        try await store.recordDecision(runID: run.id, name: "b", value: "3", owner: "engine", durability: .coalesced)
        try await store.makeDurable()
        let history = try await store.history(runID: run.id)
        #expect(history.map(\.step) == ["first", "a", "b"])
        #expect(history.map(\.seq) == [1, 2, 3], "an entry was numbered after one that was undone")
    }

    /// A record numbers its entry from the run's last one, read with its check: every kind of
    /// record, two entries in one write (a transition and its hop), an entry another process
    /// appended between two transactions, and entries appended by a write that is not a record.
    @Test func everyRecordNumbersItsEntriesRightAfterTheRunsLastWhoeverAppendedIt() async throws {
        let folder = try TemporaryDirectory()
        let store = try await CoalescedWriteTests.holdingStore(folder)
        let (run, first) = try await Self.heldRun(store, owner: "engine")
        try await store.recordDecision(runID: run.id, name: "a", value: "1", owner: "engine", durability: .coalesced)
        try await store.makeDurable()
        // Another process (as hopctl would) ends the step in flight.
        let other = try await CoalescedWriteTests.elsewhere(folder)
        try await other.recordUnhop(runID: run.id, token: first, owner: nil, durability: .now)
        let hop = try await store.recordHop(runID: run.id, step: "second", from: "first", owner: "engine")
        try await store.recordUnhop(runID: run.id, token: hop.token ?? "", owner: "engine", durability: .coalesced)
        try await store.markUsed(runID: run.id, feature: "tour", owner: "engine", durability: .coalesced)
        _ = try await store.recordPatch(runID: run.id, name: "p", owner: "engine", durability: .coalesced)
        // A write that is not a record appends an entry of its own in the same open transaction.
        _ = try await store.write(.coalesced, "append from elsewhere in the store") { tx in
            try tx.append(runID: run.id, .error, value: "between", operation: "append from elsewhere in the store")
        }
        _ = try await store.recordTimer(runID: run.id, name: "t", deadline: Date(), owner: "engine")
        try await store.completeRun(runID: run.id, owner: "engine", durability: .now)
        let history = try await other.history(runID: run.id)
        #expect(
            history.map(\.kind) == [
                .hop, .decision, .unhop, .transition, .hop, .unhop, .effect, .patch, .error, .timer, .complete,
            ])
        #expect(history.map(\.seq) == Array(1...11), "an entry was not numbered right after the last")
    }

    @Test func aHopAndAnUnhopInOneTransactionAreFollowedByTheRecordsAfterThem() async throws {
        let folder = try TemporaryDirectory()
        let store = try await CoalescedWriteTests.holdingStore(folder)
        let (run, first) = try await Self.heldRun(store, owner: "engine")
        let before = await store.commitStatistics
        // The first step ends and the second is entered, together; its unhop follows in the same transaction.
        let written = try await store.record(
            [
                .unhop(token: first, output: nil),
                .hop(step: "second", from: nil, parks: false, wakeOn: nil, deadline: nil),
            ],
            runID: run.id, owner: "engine", durability: .coalesced)
        let second = written.last?.token ?? ""
        // The first step's token no longer ends anything, the second's does, once.
        await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: first, owner: "engine", durability: .coalesced)
        }
        try await store.recordUnhop(runID: run.id, token: second, owner: "engine", durability: .coalesced)
        await #expect(throws: HopError.self) {
            try await store.recordUnhop(runID: run.id, token: second, owner: "engine", durability: .coalesced)
        }
        // With no step in flight, a hop is accepted; then the run completes and takes no more records.
        _ = try await store.record(
            [.hop(step: "third", from: nil, parks: false, wakeOn: nil, deadline: nil)], runID: run.id, owner: "engine",
            durability: .coalesced)
        await #expect(throws: HopError.self) {
            try await store.record(
                [.hop(step: "fourth", from: nil, parks: false, wakeOn: nil, deadline: nil)], runID: run.id,
                owner: "engine", durability: .coalesced)
        }
        try await store.completeRun(runID: run.id, owner: "engine", durability: .coalesced)
        await #expect(throws: HopError.self) {
            try await store.recordDecision(
                runID: run.id, name: "late", value: "1", owner: "engine", durability: .coalesced)
        }
        #expect(await store.commitStatistics == before, "the writes did not share one open transaction")
        try await store.makeDurable()
        let other = try await CoalescedWriteTests.elsewhere(folder)
        let history = try await other.history(runID: run.id)
        #expect(
            history.map(\.kind) == [.hop, .unhop, .hop, .unhop, .hop, .complete]
                && history.map(\.seq) == Array(1...6))
        let stored = try await other.run(id: run.id)
        #expect(stored?.status == .completed && stored?.currentStep == "third" && stored?.currentToken == nil)
        #expect(try await other.integrityCheck() == ["ok"])
    }
}
