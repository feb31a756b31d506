import Foundation
import HopStore
import HopTestSupport
import Testing

@testable import HopctlCommands

/// `hopctl history` of a run that went round a loop for a long time: a device's flow that looped
/// every minute for a year holds a million history entries, and an operator who lists them on a
/// small board must not run it out of memory.
@Suite struct LongHistoryTests {
    /// A database whose run 1 (flow `loop`, subject `s`) went round its `tick` step `laps` times,
    /// a hop and an unhop each lap, and is in flight at its next tick.
    static func loopRun(laps: Int, in store: any HopAdministration) async throws {
        var entries: [HistoryEntry] = []
        entries.reserveCapacity(2 * laps + 1)
        let at = Date(timeIntervalSince1970: 1_700_000_000)
        for seq in 1...Int64(2 * laps + 1) {
            entries.append(
                .recorded(
                    runID: 1, seq: seq, kind: seq % 2 == 1 ? .hop : .unhop, step: "tick", token: "t\(seq / 2)",
                    value: nil, at: at))
        }
        try await store.restore(
            HopSnapshot(
                runs: [
                    RunRecord(
                        id: 1, flow: "loop", subject: "s", flowVersion: "1", status: .running, currentStep: "tick")
                ],
                history: entries, firstUse: [], sessions: [], facts: []))
    }

    /// Runs the built product `executable` with `arguments` through `hop-test-store peak-memory`,
    /// which measures the peak resident memory of the process it starts: its result, and that
    /// peak in MiB.
    static func peakMemory(
        of executable: String, _ arguments: [String], in folder: TemporaryDirectory
    ) async throws -> (result: (status: Int32, stdout: String, stderr: String), peakMiB: Double) {
        let peakFile = folder.path("peak-\(UUID().uuidString)")
        // A debug build beside the whole suite on 2 cores: far slower than alone (3 s).
        let result = try await run(
            "hop-test-store", ["peak-memory", peakFile, builtProduct(executable)] + arguments, in: folder,
            timeout: .seconds(300))
        let text = (try? String(contentsOfFile: peakFile, encoding: .utf8)) ?? ""
        let kiB = try #require(
            Double(text.trimmingCharacters(in: .whitespacesAndNewlines)),
            "no peak measured: \(result.stderr)")
        return (result, kiB / 1024)
    }

    @Test func theHistoryOfALongRunIsPrintedInTheMemoryOfAPageOfIt() async throws {
        let folder = try TemporaryDirectory()
        let laps = 80_000
        try await Self.loopRun(laps: laps, in: try await HopStore.open(path: folder.database))
        for (json, allRuns) in [(false, false), (true, false), (false, true), (true, true)] {
            let arguments =
                ["history", "--flow", "loop"] + (allRuns ? ["--all-runs"] : ["--subject", "s"])
                + ["--db", folder.database] + (json ? ["--json"] : [])
            let (result, peakMiB) = try await Self.peakMemory(of: "hopctl", arguments, in: folder)
            #expect(result.status == 0, "\(result.stderr)")
            if json {
                let parsed = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8))
                let object = try #require(allRuns ? (parsed as? [[String: Any]])?.first : parsed as? [String: Any])
                let entries = try #require(object["entries"] as? [[String: Any]])
                #expect(entries.count == 2 * laps + 1)
                #expect(entries.last?["seq"] as? Int == 2 * laps + 1)
                #expect((object["run"] as? [String: Any])?["run"] as? Int == 1)
            } else {
                let lines = result.stdout.split(separator: "\n")
                #expect(lines.count == 2 + 2 * laps + 1)  // the run's line, the header, the entries
                #expect(lines.last?.hasPrefix("\(2 * laps + 1)  hop ") == true, "\(lines.last ?? "")")
            }
            // The whole history held at once took 71 MiB as a table and 170 MiB as JSON here
            // (128 and 307 MiB at 150,000 laps); a page of entries at a time holds a few MiB beside
            // the process's own 20.
            #expect(peakMiB < 40, "hopctl \(arguments) peaked at \(peakMiB) MiB")
        }
    }

    /// `hopctl fork` of a long run copies the entries it takes inside the database, on a file and
    /// on a server: it read the whole history for its checks before, and held it while it wrote
    /// it again (a fork of a million entries peaked at 212 MiB on a file, 232 MiB on a server).
    @Test(arguments: TestBackend.all) func aForkOfALongRunTakesItsEntriesWithoutHoldingThem(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let laps = 100_000
        let store = try await backend.open(folder)
        try await Self.loopRun(laps: laps, in: store)
        let db = try await backend.location(folder)
        let (status, resting) = try await Self.peakMemory(
            of: "hopctl", ["status", "--flow", "loop", "--subject", "s", "--db", db], in: folder)
        #expect(status.status == 0, "\(status.stderr)")
        let through = 2 * laps  // the last lap's unhop: no step in flight
        let (fork, peakMiB) = try await Self.peakMemory(
            of: "hopctl",
            ["fork", "--flow", "loop", "--subject", "s", "--run", "1", "--from", "\(through)", "--db", db],
            in: folder)
        #expect(fork.status == 0 && fork.stdout.contains("into run 2"), "\(fork.stdout)\(fork.stderr)")
        let taken = try await store.history(runID: 2)
        #expect(taken.count == through + 1)
        // Each entry taken, in order, after the link (a mismatch named, not the whole history).
        let wrong = zip(1...through, taken.dropFirst()).first { seq, entry in
            entry.seq != seq + 1 || entry.kind != (seq % 2 == 1 ? .hop : .unhop) || entry.token != "t\(seq / 2)"
        }
        #expect(wrong == nil, "entry \(wrong?.0 ?? 0) was taken as \(String(describing: wrong?.1))")
        // Measured in a debug build, above a status of the run: 52 MiB on a file and 57 MiB on a
        // server before; 4 MiB (SQLite's page cache) and 0.5 MiB now.
        #expect(peakMiB - resting < 10, "the fork peaked at \(peakMiB) MiB, a status at \(resting)")
    }

    /// A history read a page at a time prints the same text as the whole history read at once,
    /// whichever page holds the widest cell of a column.
    @Test(arguments: TestBackend.all) func aHistoryReadAPageAtATimePrintsWhatTheWholeHistoryPrints(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let at = Date(timeIntervalSince1970: 1_700_000_000)
        let steps = [
            "a", "b", "a-much-longer-step-name", "c\u{7}bell", "d", "e", "the-widest-step-of-all-in-the-last-page",
        ]
        var entries: [HistoryEntry] = []
        for (index, step) in steps.enumerated() {
            let seq = Int64(index + 1)
            let value: String? =
                switch index % 3 {
                case 0: nil
                case 1: #"{"ok":true,"list":[1,2],"text":"line\nbreak"}"#
                default: String(repeating: "long output ", count: 10)
                }
            entries.append(
                .recorded(
                    runID: 1, seq: seq, kind: index % 2 == 0 ? .hop : .unhop, step: step, token: "t\(index)",
                    value: value, at: at.addingTimeInterval(Double(index) * 3700)))
        }
        entries.append(.recorded(runID: 1, seq: 8, kind: .complete, step: nil, value: nil, at: at))
        try await store.restore(
            HopSnapshot(
                runs: [RunRecord(id: 1, flow: "loop", subject: "s", flowVersion: "1", status: .completed)],
                history: entries, firstUse: [], sessions: [], facts: []))
        let run = try #require(try await store.run(id: 1))
        // The embedder's way to page through a history: the same entries, page after page.
        for page in [1, 3, 8, 9] {
            var paged: [HistoryEntry] = []
            while true {
                let next = try await HopDatabase(store).history(runID: 1, after: paged.last?.seq ?? 0, limit: page)
                paged += next
                if next.count < page { break }
            }
            #expect(paged == entries, "pages of \(page)")
        }
        let now = at.addingTimeInterval(86_400 * 3)
        for json in [false, true] {
            var whole = ""
            try await HistoryRequest.printWhole(run, json: json, in: store, page: 100, now: now) { whole += $0 }
            for page in [1, 2, 3, 7, 8] {
                var paged = ""
                try await HistoryRequest.printWhole(run, json: json, in: store, page: page, now: now) { paged += $0 }
                #expect(paged == whole, "json: \(json), page: \(page)\n\(paged)\n---\n\(whole)")
            }
            if json {
                let object = try #require(try JSONSerialization.jsonObject(with: Data(whole.utf8)) as? [String: Any])
                #expect((object["entries"] as? [Any])?.count == 8)
            } else {
                #expect(whole.split(separator: "\n").count == 10, "\(whole)")  // the run's line, the header, 8 entries
                #expect(whole.contains("the-widest-step-of-all-in-the-last-page"))
            }
        }
    }

    /// `--all-runs` reads short runs' histories many runs at a time, and a long run's on its own a
    /// page at a time: the same text as reading every history at once.
    @Test(arguments: TestBackend.all) func allRunsReadInBatchesAndPagesPrintWhatAllAtOncePrints(
        backend: TestBackend
    ) async throws {
        let folder = try TemporaryDirectory()
        let store = try await backend.open(folder)
        let at = Date(timeIntervalSince1970: 1_700_000_000)
        // Runs 1…6 of 3, 12, 1, 0, 8 and 5 entries: with pages of 5 entries, runs 2 and 5 are long.
        let lengths = [3, 12, 1, 0, 8, 5]
        var runs: [RunRecord] = []
        var entries: [HistoryEntry] = []
        for (index, length) in lengths.enumerated() {
            let id = Int64(index + 1)
            runs.append(
                RunRecord(
                    id: id, flow: "loop", subject: "s\(index % 2)", flowVersion: "1",
                    status: index == 1 ? .running : .completed, currentStep: index == 1 ? "step-\(length - 1)" : nil))
            for seq in 0..<length {
                entries.append(
                    .recorded(
                        runID: id, seq: Int64(seq + 1), kind: seq % 2 == 0 ? .hop : .unhop,
                        step: String(repeating: "s", count: 1 + (seq * 7 + index) % 23), token: "t\(seq / 2)",
                        value: seq % 3 == 0 ? #"{"n":\#(seq)}"# : nil, at: at.addingTimeInterval(Double(seq) * 3700)))
            }
        }
        runs[1].currentToken = "t5"  // run 2 is in flight at its entry 11, the hop of token t5
        try await store.restore(HopSnapshot(runs: runs, history: entries, firstUse: [], sessions: [], facts: []))
        #expect(try await store.historyLengths(runIDs: [1, 2, 4, 99]) == [1: 3, 2: 12, 4: 0, 99: 0])
        let now = at.addingTimeInterval(86_400 * 3)
        for json in [false, true] {
            let request = HistoryRequest(
                db: nil, json: json, subject: "default", flow: "loop", run: nil, limit: nil, allRuns: true)
            var atOnce = ""
            try await request.printAllRuns(store, entryPage: 100, batchEntries: 100, now: now) { atOnce += $0 }
            for (entryPage, batchEntries) in [(5, 5), (5, 9), (7, 1), (11, 50)] {
                var paged = ""
                try await request.printAllRuns(store, entryPage: entryPage, batchEntries: batchEntries, now: now) {
                    paged += $0
                }
                #expect(paged == atOnce, "json: \(json), pages of \(entryPage), batches of \(batchEntries)")
            }
            if json {
                let array = try #require(try JSONSerialization.jsonObject(with: Data(atOnce.utf8)) as? [[String: Any]])
                #expect(array.map { ($0["entries"] as? [Any])?.count ?? -1 } == lengths)
                #expect((array[1]["run"] as? [String: Any])?["current_step_entry"] as? Int == 11)
            } else {
                #expect(atOnce.components(separatedBy: "run ").count - 1 == lengths.count, "\(atOnce)")
            }
        }
    }
}
