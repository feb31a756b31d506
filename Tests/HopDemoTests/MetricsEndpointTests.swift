import Foundation
import HopStore
import HopTestSupport
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `hop-demo --metrics-port`: the engine's metrics in Prometheus' text format over a real socket.
@Suite struct MetricsEndpointTests {
    /// The status, content type and body of a GET of `url`.
    func get(_ url: URL) async throws -> (status: Int, contentType: String?, body: String) {
        var request = URLRequest(url: url)
        request.timeoutInterval = 10
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        return (http.statusCode, http.value(forHTTPHeaderField: "Content-Type"), String(decoding: data, as: UTF8.self))
    }

    /// The port of the metrics URL hop-demo printed.
    func metricsPort(of demo: ChildProcess) async throws -> Int {
        let prefix = "metrics at http://127.0.0.1:"
        try await demo.waitForOutput(prefix)
        let line = try #require(demo.stdout.split(separator: "\n").first { $0.contains(prefix) })
        let tail = try #require(line.range(of: prefix)).upperBound
        return try #require(Int(line[tail...].prefix { $0.isNumber }))
    }

    /// Whether a socket listens on `port` at 127.0.0.1 only (`/proc/net/tcp`: state 0A, LISTEN).
    func listensOnLoopbackOnly(_ port: Int) throws -> Bool {
        let local = ":" + String(format: "%04X", port)
        let table = try String(contentsOfFile: "/proc/net/tcp", encoding: .utf8)
        var addresses: [String] = []
        for row in table.split(separator: "\n") {
            let fields = row.split(separator: " ").map(String.init)
            if fields.count > 3, fields[3] == "0A", fields[1].hasSuffix(local) { addresses.append(fields[1]) }
        }
        return !addresses.isEmpty && addresses.allSatisfy { $0 == "0100007F" + local }
    }

    @Test func theDemoServesTheEnginesCountersAndStepTimesAndFollowsTheFlow() async throws {
        let folder = try TemporaryDirectory()
        let demo = try ChildProcess("hop-demo", ["--db", folder.database, "--metrics-port", "0"], directory: folder)
        defer { demo.kill() }
        let port = try await metricsPort(of: demo)
        #expect(try listensOnLoopbackOnly(port), "the endpoint listens on 127.0.0.1 only")
        try await demo.waitForOutput("parked at onboarding")
        let url = try #require(URL(string: "http://127.0.0.1:\(port)/metrics"))

        let parked = try await get(url)
        #expect(parked.status == 200)
        #expect(parked.contentType == "text/plain; version=0.0.4; charset=utf-8")
        let lines = Set(parked.body.split(separator: "\n").map(String.init))
        for line in [
            "# TYPE hop_hops_total counter", "hop_hops_total 2", "hop_unhops_total 1", "hop_resumes_total 0",
            "# TYPE hop_step_duration_seconds histogram", "hop_step_duration_seconds_count{step=\"splash\"} 1",
            "# TYPE hop_database_up gauge", "hop_database_up 1.0",
        ] {
            #expect(lines.contains(line), "no \"\(line)\" in:\n\(parked.body)")
        }

        // Onboarding finished from another process: the daemon resumes the run and hops to login.
        let unhop = try await run(
            "hopctl", ["unhop", "--flow", "startup", "--step", "onboarding", "--db", folder.database], in: folder)
        #expect(unhop.status == 0, "\(unhop.stderr)")
        try await waitUntil("the metrics count the hop to login") {
            let body = try await get(url).body.split(separator: "\n")
            // The unhop was hopctl's, not this engine's: the daemon counts the resume and the hop.
            return body.contains("hop_hops_total 3") && body.contains("hop_unhops_total 1")
                && body.contains("hop_resumes_total 1")
        }
        let elsewhere = try #require(URL(string: "http://127.0.0.1:\(port)/"))
        #expect(try await get(elsewhere).status == 404)

        demo.kill(SIGTERM)
        #expect(try await demo.waitForExit() == 0)
        #expect(try !listensOnLoopbackOnly(port), "the server stopped with the daemon")
    }

    @Test func aPortInUseOrOutOfRangeIsRefusedSayingWhichOptionToChange() async throws {
        let folder = try TemporaryDirectory()
        let first = try ChildProcess("hop-demo", ["--db", folder.database, "--metrics-port", "0"], directory: folder)
        defer { first.kill() }
        let port = try await metricsPort(of: first)

        let other = try TemporaryDirectory()
        let second = try await run("hop-demo", ["--db", other.database, "--metrics-port", "\(port)"], in: other)
        #expect(second.status == 1)
        #expect(second.stderr.contains("cannot serve metrics on 127.0.0.1:\(port)"), "\(second.stderr)")
        #expect(second.stderr.contains("Pick another --metrics-port"))
        // Refused before the flow starts: no run begun and left behind.
        #expect(!second.stdout.contains("started"), "\(second.stdout)")
        #expect(try await HopStore.open(path: other.database).latestRun(flow: "startup", subject: "default") == nil)

        for port in ["70000", "-1"] {
            let outOfRange = try await run("hop-demo", ["--db", other.database, "--metrics-port", port], in: other)
            #expect(outOfRange.status == 64)
            #expect(outOfRange.stderr.contains("--metrics-port is a TCP port"), "\(outOfRange.stderr)")
        }
    }

    /// A daemon refused for a port in use begins nothing: a run in flight, left by a copy of the
    /// daemon killed in its splash, is left as it was, for the next start to resume. Before, the
    /// engine resumed it while the metrics server failed to listen: it took the run over and
    /// entered the splash again (4 of 4 tries by hand), then stopped with the error.
    @Test func aPortInUseLeavesARunInFlightAsItWas() async throws {
        let busy = try TemporaryDirectory()
        let first = try ChildProcess("hop-demo", ["--db", busy.database, "--metrics-port", "0"], directory: busy)
        defer { first.kill() }
        let port = try await metricsPort(of: first)

        let folder = try await Self.runKilledInItsSplash()
        let refused = try await run("hop-demo", ["--db", folder.database, "--metrics-port", "\(port)"], in: folder)
        #expect(refused.status == 1, "\(refused.stdout)\(refused.stderr)")
        #expect(refused.stderr.contains("cannot serve metrics on 127.0.0.1:\(port)"), "\(refused.stderr)")
        let store = try await HopStore.open(path: folder.database)
        let history = try await store.history(runID: 1)
        #expect(history.map(\.kind) == [.hop], "the refused daemon touched the run: \(history.map(\.kind))")

        let next = try await run("hop-demo", ["--auto", "--db", folder.database], in: folder)
        #expect(next.status == 0, "\(next.stdout)\(next.stderr)")
        #expect(next.stdout.contains("resuming run 1"), "\(next.stdout)")
    }

    /// A database whose run 1 is in flight in its splash: `hop-demo` killed (SIGKILL) there.
    /// The splash lasts half a second; a kill that came after it is tried again on a new database.
    static func runKilledInItsSplash() async throws -> TemporaryDirectory {
        for _ in 0..<5 {
            let folder = try TemporaryDirectory()
            let demo = try ChildProcess("hop-demo", ["--db", folder.database], directory: folder)
            try await demo.waitForOutput("-> splash")
            demo.kill()
            _ = try await demo.waitForExit()
            let store = try await HopStore.open(path: folder.database)
            if try await store.history(runID: 1).map(\.kind) == [.hop] { return folder }
        }
        throw TestFailure("hop-demo was never killed in its splash in 5 tries")
    }
}
