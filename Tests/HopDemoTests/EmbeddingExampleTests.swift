import Foundation
import HopStore
import HopTestSupport
import Testing

/// The README's "Embedding in a daemon" example is `Examples/MinimalDaemon/MinimalDaemon.swift`,
/// compiled as `hop-minimal-daemon`; these tests keep the two the same and run the daemon.
@Suite struct EmbeddingExampleTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func theReadmeShowsTheCompiledExampleVerbatim() throws {
        let readme = try String(contentsOf: Self.packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let source = try String(
            contentsOf: Self.packageRoot.appendingPathComponent("Examples/MinimalDaemon/MinimalDaemon.swift"),
            encoding: .utf8)
        let marker = "<!-- Examples/MinimalDaemon/MinimalDaemon.swift -->\n```swift\n"
        let start = try #require(readme.range(of: marker), "README lacks the marker before the embedding example")
        let end = try #require(readme.range(of: "```\n", range: start.upperBound..<readme.endIndex))
        let shown = String(readme[start.upperBound..<end.lowerBound])
        #expect(
            shown == source,
            "README's embedding example differs from Examples/MinimalDaemon/MinimalDaemon.swift; copy the file into the README"
        )
    }

    /// A daemon that embeds HopEngine on SQLite builds none of SwiftNIO, PostgreSQL's client or the
    /// HTTP server (only HopPostgres and the demo's metrics endpoint do); hopctl neither (it hands
    /// a server's database to hopctl-postgres). Their code would be in the binaries' symbols.
    @Test(arguments: ["hop-minimal-daemon", "hopctl"])
    func aSQLiteOnlyBinaryLinksNoNetworkingOrPostgreSQL(product: String) throws {
        let binary = try Data(contentsOf: URL(fileURLWithPath: builtProduct(product)))
        for module in ["NIOCore", "NIOPosix", "PostgresNIO", "Hummingbird", "HopPostgres"] {
            #expect(binary.range(of: Data(module.utf8)) == nil, "\(product) links \(module)")
        }
        // The check finds such code where it is linked.
        let demo = try Data(contentsOf: URL(fileURLWithPath: builtProduct("hop-demo")))
        #expect(demo.range(of: Data("NIOCore".utf8)) != nil)
    }

    @Test func theExampleDaemonRunsTheFlowIsReroutedByLogoutAndStopsOnSigterm() async throws {
        let folder = try TemporaryDirectory()
        let environment = ["HOP_DB": folder.database]
        let daemon = try ChildProcess("hop-minimal-daemon", [], environment: environment, directory: folder)
        defer { daemon.kill() }
        // The daemon creates the database; the test opens it once it exists, without creating or
        // migrating it, so that the test's own open never races the daemon's first one.
        var opened: HopStore?
        try await waitUntil("hop-minimal-daemon created its database", timeout: .seconds(120)) {
            if let status = daemon.exitStatus {
                throw TestFailure(
                    "hop-minimal-daemon ended with \(status) before creating its database:\n\(daemon.stderr)")
            }
            do {
                opened = try await HopStore.open(
                    path: folder.database, options: .init(createIfMissing: false, migrate: false))
            } catch let error as HopError where [.missing, .schemaOutdated, .busy].contains(error.code) {
                return false
            }
            return true
        }
        let store = try #require(opened)
        func at(_ step: String) async throws {
            do {
                // Generous: under a sanitizer, beside the whole suite, the daemon starts slowly.
                try await waitUntil("the start-up run is parked at \(step)", timeout: .seconds(120)) {
                    if let status = daemon.exitStatus {
                        throw TestFailure("hop-minimal-daemon ended with \(status) before \(step)")
                    }
                    let run = try await store.latestRun(flow: "startup", subject: "default")
                    return run?.status == .parked && run?.currentStep == step
                }
            } catch {
                let runs = try await store.runs().map {
                    "\($0.id) \($0.status.rawValue) \($0.currentStep ?? "-") owner \($0.owner ?? "-")"
                }
                throw TestFailure("\(error)\nruns: \(runs)\nhop-minimal-daemon stderr:\n\(daemon.stderr)")
            }
        }
        func hopctl(_ arguments: [String]) async throws {
            let result = try await run("hopctl", arguments + ["--db", folder.database], in: folder)
            #expect(result.status == 0, "hopctl \(arguments): \(result.stderr)")
        }
        try await at("onboarding")
        try await hopctl(["unhop", "--flow", "startup", "--step", "onboarding"])
        try await at("login")
        try await hopctl(["session", "login", "alice"])
        try await at("main")
        try await hopctl(["session", "logout"])
        try await at("login")

        daemon.kill(SIGTERM)
        #expect(try await daemon.waitForExit() == 0, "\(daemon.stderr)")
        #expect(!daemon.wasSignalled)
        let history = try await run("hopctl", ["history", "--flow", "startup", "--db", folder.database], in: folder)
        #expect(history.stdout.contains("reroute"), "\(history.stdout)")
        let latest = try #require(try await store.latestRun(flow: "startup", subject: "default"))
        #expect(latest.status == .parked && latest.currentStep == "login")
    }
}
