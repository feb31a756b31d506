import CHopFaultVFS
import CSQLite
import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryLogging
import Logging
import Testing

/// I/O faults injected at every write, sync, truncate and file-size call of the start-up flow
/// in turn, the way SQLite tests itself: each fault is a clear error, leaves nothing
/// half-written and the file sound, and once it is cleared the run ends as if nothing happened.
/// The one call SQLite does without, cutting the write-ahead log back to its limit after a
/// commit (`journal_size_limit`: its size, then a truncation), changes nothing when it fails.
@Suite(.serialized) struct FaultInjectionTests {
    @Test(arguments: [SQLITE_IOERR | (3 << 8) /* SQLITE_IOERR_WRITE */, SQLITE_FULL])
    func aFaultAtEveryCallIsAClearErrorAndTheRunResumesToTheSameHistory(code: Int32) async throws {
        var n = 0
        var faultsSeen = 0
        var faultsIgnored = 0
        while true {
            n += 1
            #expect(n < 400, "the flow never ran without hitting the fault")
            if n >= 400 { return }
            let folder = try TemporaryDirectory()
            let errors = InMemoryLogHandler.keepingEverything()
            let logger = errors.logger(label: "faults")
            hop_fault_vfs_fail_at(n, code)
            var thrown: (any Error)?
            var runID: Int64?
            var store: HopStore?
            do {
                let opened = try await HopStore.open(path: folder.database, options: faultOptions(), logger: logger)
                store = opened
                let engine = HopEngine(store: opened, logger: logger)
                registerInstantStartup(on: engine)
                let run = try await engine.start("startup")
                runID = run.id
                _ = try await engine.settled(runID: run.id)
            } catch {
                thrown = error
            }
            let hit = hop_fault_vfs_faults() > 0
            let call = UnicodeScalar(UInt8(truncatingIfNeeded: hop_fault_vfs_faulted_call()))
            hop_fault_vfs_fail_at(0, 0)
            if !hit {
                // Past the last counted call: the run went through untouched.
                let store = try #require(store)
                #expect(try await historyPath(store, runID: try #require(runID)) == referencePath)
                break
            }
            faultsSeen += 1

            // The failing call surfaced as a clear error: thrown, or logged by the engine for the run.
            let logged = errors.texts(atLeast: .error)
            let reported = thrown.map { "\($0)" } ?? logged.joined(separator: "\n")
            if thrown != nil || !logged.isEmpty {
                #expect(
                    reported.contains(folder.database), "fault \(n): the error does not name the database: \(reported)")
            }
            if thrown == nil, let store, let runID {
                // Nothing half-written: the stored history is a prefix of the reference, and the
                // run row agrees with it.
                let partial = try await historyPath(store, runID: runID)
                #expect(Array(referencePath.prefix(partial.count)) == partial, "fault \(n): \(partial)")
                let row = try #require(try await store.run(id: runID))
                if row.status == .completed {
                    #expect(partial == referencePath, "fault \(n): completed with \(partial)")
                    if logged.isEmpty {
                        // A fault SQLite did without: only the log's cut back to its limit.
                        #expect(call == "f" || call == "t", "fault \(n) of a '\(call)' call changed nothing")
                        #expect(try await store.integrityCheck() == ["ok"], "fault \(n)")
                        faultsIgnored += 1
                        continue
                    }
                } else {
                    #expect(!logged.isEmpty, "fault \(n): the run stopped without an error")
                }
            }

            // The fault cleared, the file is sound and a new engine ends the run as if nothing happened.
            let reopened = try await HopStore.open(path: folder.database, options: faultOptions())
            #expect(try await reopened.integrityCheck() == ["ok"], "fault \(n)")
            let engine = HopEngine(
                store: reopened, logger: Logger(label: "faults", factory: { _ in SwiftLogNoOpLogHandler() }))
            registerInstantStartup(on: engine)
            let run = try await engine.start("startup")
            #expect(try await engine.settled(runID: run.id)?.status == .completed, "fault \(n)")
            if let runID { #expect(run.id == runID, "fault \(n): a second run was started instead of resuming") }
            #expect(try await historyPath(reopened, runID: run.id) == referencePath, "fault \(n)")
        }
        #expect(faultsSeen > 20, "only \(faultsSeen) calls were faulted")
        #expect(faultsIgnored <= 2, "\(faultsIgnored) of \(faultsSeen) faults changed nothing")
    }

    @Test func creatingADatabaseOnAFullDiskLeavesNoFileBehind() async throws {
        let folder = try TemporaryDirectory()
        hop_fault_vfs_fail_at(1, SQLITE_FULL)
        defer { hop_fault_vfs_fail_at(0, 0) }
        let error = await #expect(throws: HopError.self) {
            try await HopStore.open(path: folder.database, options: faultOptions())
        }
        #expect(hop_fault_vfs_faults() == 1)
        #expect(
            error?.code == .ioFailure && error?.description.contains("disk is full") == true,
            "\(String(describing: error))")
        #expect(
            error?.description.contains("The empty file it had created was removed") == true,
            "\(String(describing: error))")
        for suffix in ["", "-wal", "-shm", "-journal"] {
            #expect(!FileManager.default.fileExists(atPath: folder.database + suffix), "\(suffix) was left behind")
        }
    }
}
