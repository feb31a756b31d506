import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

@Suite struct BadFileTests {
    @Test func aFileThatIsNotADatabaseIsRefusedAndKeptAsItWas() async throws {
        let folder = try TemporaryDirectory()
        let garbage = Data("this is a shopping list, not a database\n".utf8) + Data(repeating: 0xAB, count: 8192)
        try garbage.write(to: URL(fileURLWithPath: folder.database))
        let error = await #expect(throws: HopError.self) { _ = try await HopStore.open(path: folder.database) }
        #expect(error?.code == .notADatabase)
        #expect(error?.description.contains(folder.database) == true)
        #expect(FileManager.default.contents(atPath: folder.database) == garbage)
    }

    @Test func aTruncatedDatabaseIsReportedNotUsed() async throws {
        let folder = try TemporaryDirectory()
        do {
            let store = try await HopStore.open(path: folder.database)
            for index in 0..<200 {
                try await store.setFact(subject: "default", key: "k\(index)", value: String(repeating: "v", count: 500))
            }
            try await store.checkpoint()
        }
        let bytes = try #require(FileManager.default.contents(atPath: folder.database))
        try? FileManager.default.removeItem(atPath: folder.database + "-wal")
        try? FileManager.default.removeItem(atPath: folder.database + "-shm")
        try bytes.prefix(bytes.count / 2).write(to: URL(fileURLWithPath: folder.database))
        await #expect(throws: HopError.self) {
            let store = try await HopStore.open(path: folder.database)
            let check = try await store.integrityCheck()
            if check == ["ok"] { _ = try await store.facts(subject: "default") }
            if check != ["ok"] {
                throw HopError(.notADatabase, operation: "check", path: folder.database, reason: check.joined())
            }
        }
    }

    @Test func aPathThatIsAFolderIsRefused() async throws {
        let folder = try TemporaryDirectory()
        let error = await #expect(throws: HopError.self) { _ = try await HopStore.open(path: folder.url.path) }
        #expect(error?.code == .cannotOpen)
        #expect(error?.description.contains("folder") == true)
    }

    @Test func aFolderThatCannotBeWrittenIsReportedWithThePath() async throws {
        // /proc refuses new files even to root, so this holds whoever runs the tests.
        let path = "/proc/hop-test-\(getpid())/hop.sqlite"
        let error = await #expect(throws: HopError.self) { _ = try await HopStore.open(path: path) }
        #expect(error?.code == .cannotOpen)
        #expect(error?.description.contains(path) == true)
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    @Test func openingWithoutCreateLeavesAMissingFileMissing() async throws {
        let folder = try TemporaryDirectory()
        let error = await #expect(throws: HopError.self) {
            _ = try await HopStore.open(
                path: folder.database, options: HopStore.Options(createIfMissing: false, migrate: false))
        }
        #expect(error?.code == .missing)
        #expect(!FileManager.default.fileExists(atPath: folder.database))
    }

    @Test func theDatabaseAndItsWALFilesAreOwnerOnlyWhateverTheUmask() async throws {
        let folder = try TemporaryDirectory()
        let path = folder.path("nested/state/hop.sqlite")
        // The helper reports the modes while its connection holds the -wal and -shm files open.
        let result = try await run(
            "hop-test-store", ["modes", path], environment: ["HOP_TEST_UMASK": "000"], in: folder)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == "hop.sqlite 600\nhop.sqlite-wal 600\nhop.sqlite-shm 600\n")
    }
}
