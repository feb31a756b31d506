import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

@Suite struct SubjectStateTests {
    @Test func firstUseIsTrueUntilMarkedAndTrueAgainAfterAReset() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding"))
        try await store.markUsed(subject: "default", feature: "onboarding")
        try await store.markUsed(subject: "default", feature: "tips")
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding") == false)
        #expect(try await store.isFirstUse(subject: "other", feature: "onboarding"))
        #expect(try await store.firstUseFlags(subject: "default").map(\.feature) == ["onboarding", "tips"])
        #expect(try await store.resetFirstUse(subject: "default", features: ["onboarding", "never-used"]) == 1)
        #expect(try await store.isFirstUse(subject: "default", feature: "onboarding"))
        #expect(try await store.resetAllFirstUse(subject: "default") == 1)
        #expect(try await store.firstUseFlags(subject: "default").isEmpty)
    }

    @Test func sessionRoundTripsAndAnExpiredSessionReadsAsNone() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.session(subject: "default") == nil)
        try await store.storeSession(subject: "default", userID: "alice", token: "s3cret-token-value")
        let session = try #require(try await store.session(subject: "default"))
        #expect(session.userID == "alice" && session.token == "s3cret-token-value" && session.expiresAt == nil)
        #expect(!session.description.contains("s3cret-token-value"))
        #expect(!"\(session)".contains("s3cret-token-value"))

        let soon = Date().addingTimeInterval(3)
        try await store.storeSession(subject: "default", userID: "bob", token: "t", expiresAt: soon)
        let beforeExpiry = try await store.session(subject: "default")
        // Read before the expiry (not on a stalled machine).
        if Date() < soon { #expect(beforeExpiry?.userID == "bob") }
        try await waitUntil("the session's expiry has come") { Date() > soon }
        #expect(try await store.session(subject: "default") == nil)
        try await store.storeSession(
            subject: "default", userID: "bob", token: "t", expiresAt: Date().addingTimeInterval(3600))
        #expect(try await store.session(subject: "default")?.userID == "bob")
        #expect(try await store.deleteSession(subject: "default").removed)
        #expect(try await store.session(subject: "default") == nil)
        #expect(try await store.deleteSession(subject: "default").removed == false)
    }

    @Test func storingASessionUnhopsARunParkedOnLoginInTheSameTransaction() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        try await store.recordHop(runID: run.id, step: "login", parks: true, wakeOn: .sessionStored)
        #expect(try await store.storeSession(subject: "default", userID: "alice", token: "tok") == [run.id])
        let history = try await store.history(runID: run.id)
        #expect(history.map(\.kind) == [.hop, .unhop])
        #expect(history[1].value == #"{"userID":"alice"}"#)
        #expect(try await store.run(id: run.id)?.status == .running)
    }

    @Test func factsRoundTrip() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.setFact(subject: "default", key: "terms-version", value: "3")
        try await store.setFact(subject: "default", key: "terms-version", value: "4")
        #expect(try await store.fact(subject: "default", key: "terms-version") == "4")
        #expect(try await store.facts(subject: "default").map(\.key) == ["terms-version"])
        #expect(try await store.removeFact(subject: "default", key: "terms-version"))
        #expect(try await store.fact(subject: "default", key: "terms-version") == nil)
    }

    static let hostileValues = [
        "it's \"quoted\"", "'; DROP TABLE runs; --", "nul\u{0}inside", String(repeating: "x", count: 1_000_000),
        "ünïcødé ✓ 🐇",
    ]

    @Test(arguments: hostileValues.indices)
    func hostileValuesAreStoredAndReadBackUnchanged(index: Int) async throws {
        let value = Self.hostileValues[index]
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.setFact(subject: "default", key: "k", value: value)
        #expect(try await store.fact(subject: "default", key: "k") == value)
        if value.utf8.count <= 4096 {
            try await store.storeSession(subject: "default", userID: "alice", token: value)
            #expect(try await store.session(subject: "default")?.token == value)
        }

        let output = String(decoding: try JSONEncoder().encode([value]), as: UTF8.self)
        let (run, _) = try await store.startRun(flow: "startup", subject: "default", version: "1")
        let hop = try await store.recordHop(runID: run.id, step: "splash")
        try await store.recordUnhop(runID: run.id, token: hop.token ?? "", output: output)
        let stored = try #require(try await store.history(runID: run.id).last?.value)
        #expect(try JSONDecoder().decode([String].self, from: Data(stored.utf8)) == [value])
        #expect(try await store.integrityCheck() == ["ok"])
    }

    static let hostileIdentifiers = [
        "", String(repeating: "n", count: 10_000), "line\nbreak", "nul\u{0}", "esc\u{1B}[31m",
    ]

    @Test(arguments: hostileIdentifiers.indices)
    func hostileIdentifiersAreRefusedBeforeAnythingIsWritten(index: Int) async throws {
        let name = Self.hostileIdentifiers[index]
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let error = await #expect(throws: HopError.self) {
            try await store.startRun(flow: "startup", subject: name, version: "1")
        }
        #expect(error?.code == .invalidInput)
        #expect(error?.description.contains("subject") == true)
        await #expect(throws: HopError.self) { try await store.markUsed(subject: "default", feature: name) }
        #expect(try await store.runs().isEmpty)
        #expect(try await store.firstUseFlags(subject: "default").isEmpty)
    }

    @Test func quotesAndSQLInIdentifiersAreJustNames() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        let name = "x'); DROP TABLE runs; --"
        let (run, _) = try await store.startRun(flow: name, subject: name, version: name)
        #expect(try await store.latestRun(flow: name, subject: name)?.id == run.id)
        #expect(try await store.integrityCheck() == ["ok"])
    }

    @Test func defaultLocationFollowsHopDBThenXDGStateHomeThenHome() {
        #expect(
            DatabaseLocation.defaultPath(environment: ["HOP_DB": "/x/y.sqlite", "XDG_STATE_HOME": "/s", "HOME": "/h"])
                == "/x/y.sqlite")
        #expect(
            DatabaseLocation.defaultPath(environment: ["XDG_STATE_HOME": "/s", "HOME": "/h"]) == "/s/hop/hop.sqlite")
        #expect(DatabaseLocation.defaultPath(environment: ["HOME": "/h"]) == "/h/.local/state/hop/hop.sqlite")
    }
}
