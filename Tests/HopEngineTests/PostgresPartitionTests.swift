import Foundation
import HopPostgres
import HopStore
import HopTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// An engine cut off from its PostgreSQL server while the server and the other engines run on
/// (a network partition): its connections go through a relay (`hop-test-proxy`) that the test
/// freezes. The server sees an idle session that keeps the engine's liveness lock, so the other
/// engines take its runs over only when their leases expire; the engine cut off must have
/// stopped executing them by then.
@Suite struct PostgresPartitionTests {
    /// A relay to the server of `url` listening in `folder`, and `url` through it.
    static func relay(to url: String, in folder: TemporaryDirectory) async throws -> (ChildProcess, String) {
        let components = try #require(URLComponents(string: url))
        let host = try #require(components.queryItems?.first { $0.name == "host" }?.value)
        let relayFolder = folder.path("relay")
        try FileManager.default.createDirectory(atPath: relayFolder, withIntermediateDirectories: true)
        let relay = try ChildProcess(
            "hop-test-proxy", [relayFolder + "/.s.PGSQL.5432", host + "/.s.PGSQL.5432"], directory: folder)
        try await relay.waitForOutput("listening")
        return (relay, url.replacingOccurrences(of: "host=\(host)", with: "host=\(relayFolder)"))
    }

    /// Daemon A runs a step that lasts until cancelled, through the relay; B runs beside it,
    /// connected directly. The relay freezes: A's lease renewals go unanswered, and B takes
    /// run 1 over once A's lease expired and enters the step again.
    ///
    /// With `.stopExecuting`, A has cancelled its step by then, by its own count of its lease
    /// (without it, A's step ran on for as long as the partition lasted). With the default,
    /// `.keepExecuting`, it runs on beside B's, and A stops it once it hears from the server
    /// again. Either way A writes nothing more to the run, and B carries it to its end.
    @Test(.enabled(if: PostgresProcessTests.available), arguments: [true, false])
    func anEngineCutOffFromItsServerStopsItsStepBeforeAnotherTakesTheRunOverWhenSoConfigured(
        stopOnLapse: Bool
    ) async throws {
        let folder = try TemporaryDirectory()
        let url = try await TestBackend.postgres.location(folder)
        let (relay, relayed) = try await Self.relay(to: url, in: folder)
        defer {
            relay.kill(SIGCONT)
            relay.kill()
        }
        // Lapsed a tenth of a lease early (0.5 s), and B looks for expired leases every third of
        // one: the room A has to stop its step before B enters it, on a loaded machine.
        let lease = 5
        let owner = try PostgresProcessTests.daemon(
            "A", url: relayed, in: folder, slowSplash: true, lease: lease,
            arguments: ["--external"] + (stopOnLapse ? ["--stop-on-lapse"] : []))
        defer { owner.kill() }
        try await owner.waitForOutput("point after:hop:splash")
        let other = try PostgresProcessTests.daemon("B", url: url, in: folder, lease: lease)
        defer { other.kill() }
        try await other.waitForOutput("ready")
        let store = try await PostgresStore.open(url: url)
        #expect(try await store.run(id: 1)?.ownerLabel == "A")

        relay.kill(SIGSTOP)
        try await other.waitForOutput("executing run 1 replaying 1", timeout: .seconds(60))
        try await waitUntil("B enters the splash again") {
            bodyLines(in: folder).filter { $0 == "1 splash" }.count == 2
        }
        let bodies = bodyLines(in: folder)
        let reentered = try #require(bodies.lastIndex(of: "1 splash"))
        if stopOnLapse {
            let cancelled = bodies.firstIndex(of: "1 splash-cancelled")
            #expect(
                cancelled.map { $0 < reentered } == true,
                "A's splash still ran when B entered it again: \(bodies)\nA: \(owner.stdout)")
        } else {
            #expect(!bodies.contains("1 splash-cancelled"), "A stopped its splash, cut off: \(bodies)")
        }
        let history = try await store.history(runID: 1)
        #expect(history.contains { $0.kind == .takeover && $0.step == "B" }, "\(history)")

        // Healed: A hears from the server again and writes nothing more to the run; B carries it on.
        relay.kill(SIGCONT)
        try await waitUntil("A's splash is stopped") { bodyLines(in: folder).contains("1 splash-cancelled") }
        try await other.waitForOutput("parked onboarding")
        #expect(owner.exitStatus == nil, "A stopped: \(owner.stdout)\(owner.stderr)")
        _ = try await store.unhopParked(flow: "startup", subject: "default", step: "onboarding", output: nil)
        try await waitUntil("the run waits at login") { try await store.run(id: 1)?.currentStep == "login" }
        try await store.storeSession(subject: "default", userID: "alice", token: "secret", expiresAt: nil)
        try await waitUntil("the run completes") { try await store.run(id: 1)?.status == .completed }
        let final = try await store.history(runID: 1)
        #expect(final.filter { $0.kind == .hop }.map { $0.step ?? "" } == ["splash", "onboarding", "login", "main"])
        #expect(final.filter { $0.kind == .unhop && $0.step == "splash" }.count == 1, "\(final)")
        // Parked, the run is held by no engine: either may carry it on after each unhop.
        #expect(final.first { $0.kind == .takeover }?.step == "B", "\(final)")
        #expect(!final.contains { [.error, .fail, .diverge].contains($0.kind) }, "\(final)")
        #expect(bodyLines(in: folder).filter { $0 == "1 splash" }.count == 2)
    }
}
