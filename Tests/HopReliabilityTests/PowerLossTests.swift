import Foundation
import HopStore
import HopTestSupport
import Testing

/// The power cut at every sync, then before every write, of the start-up flow in turn
/// (`hop-test-faults`, whose VFS holds writes until they are synced and drops them at the cut).
@Suite struct PowerLossTests {
    /// With synchronous=FULL, every history entry durable when acknowledged (a hop, the
    /// completion) is on disk after the cut with every entry before it; coalesced entries
    /// acknowledged after the last of those may be lost, but only from the end. The file is
    /// sound, and the flow resumes to the history of an uncut run.
    @Test(arguments: ["--power-loss-at", "--power-loss-at-write"])
    func withFullSyncEveryAcknowledgedHopSurvivesAPowerCut(at cutOption: String) async throws {
        var n = 0
        var cuts = 0
        while true {
            n += 1
            #expect(n < 400, "the flow never ran without a power cut")
            if n >= 400 { return }
            let folder = try TemporaryDirectory()
            let child = try await run("hop-test-faults", ["--db", folder.database, cutOption, "\(n)"], in: folder)
            let acknowledged = child.stdout.split(separator: "\n").filter { $0.hasPrefix("ack ") }.map {
                $0.dropFirst(4)
            }
            if child.status == 0 {
                #expect(child.stdout.contains("completed"), "\(child.stdout)")
                break
            }
            #expect(child.status == 86, "cut \(n): \(child.stderr)")
            cuts += 1

            // After the cut: the file opens, is sound, and holds every acknowledged entry.
            let store = try await HopStore.open(path: folder.database)
            #expect(try await store.integrityCheck() == ["ok"], "cut \(n)")
            var stored: [HistoryEntry] = []
            if let crashed = try await store.latestRun(flow: "startup", subject: "default") {
                stored = try await store.history(runID: crashed.id)
            }
            let lines = stored.map { "\($0.seq) \($0.kind.rawValue) \($0.step ?? "-")" }
            let lastDurable =
                acknowledged.lastIndex {
                    $0.split(separator: " ").dropFirst().first.map { ["hop", "complete"].contains($0) } ?? false
                }
                ?? -1
            for entry in acknowledged.prefix(lastDurable + 1) {
                #expect(lines.contains(String(entry)), "cut \(n): acknowledged \"\(entry)\" was lost")
            }
            let kept = lines.filter { line in acknowledged.contains { $0 == line } }
            #expect(
                kept == acknowledged.prefix(kept.count).map(String.init),
                "cut \(n): what survived is not a prefix of what was acknowledged: \(lines)")

            // And the flow resumes to the end with the same history as a run without a cut.
            let resumed = try await run("hop-test-faults", ["--db", folder.database], in: folder)
            #expect(resumed.status == 0 && resumed.stdout.contains("completed"), "after cut \(n): \(resumed.stderr)")
            // The first run (a helper started after it completed starts, and completes, a second).
            let first = try #require(try await store.allRuns(flow: "startup", subject: "default").first)
            let final = try await historyPath(store, runID: first.id)
            #expect(
                final == referencePath, "after cut \(n): \(final)\nacknowledged: \(acknowledged)\n\(resumed.stdout)")
        }
        #expect(cuts > 10, "only \(cuts) power cuts happened")
    }

    /// With synchronous=NORMAL a commit is not synced: a cut loses the commits since the last
    /// checkpoint's sync (what the README documents), but never leaves a damaged file. This
    /// also shows that the harness does drop unsynced writes.
    @Test func withNormalSyncACutLosesTheLatestCommitsButNeverDamagesTheFile() async throws {
        var lost = 0
        for n in 1...400 {
            let folder = try TemporaryDirectory()
            let child = try await run(
                "hop-test-faults", ["--db", folder.database, "--power-loss-at-write", "\(n)", "--normal"], in: folder)
            if child.status == 0 { break }
            #expect(child.status == 86, "cut before write \(n): \(child.stderr)")
            let acknowledged = child.stdout.split(separator: "\n").filter { $0.hasPrefix("ack ") }.count
            let store = try await HopStore.open(path: folder.database)
            #expect(try await store.integrityCheck() == ["ok"], "cut before write \(n)")
            var stored = 0
            if let crashed = try await store.allRuns(flow: "startup", subject: "default").first {
                stored = try await store.history(runID: crashed.id).count
            }
            #expect(stored <= acknowledged)
            if stored < acknowledged { lost += 1 }
        }
        #expect(lost > 0, "no power cut lost an unsynced commit: the harness does not model a cut")
    }
}
