import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

/// What Hop adopts as its database file, and what it refuses, tried as an operator would with hopctl.
@Suite struct DatabaseFileTests {
    @Test func anExistingEmptyFileOfMode0644IsMadePrivateWithItsCompanions() async throws {
        let folder = try TemporaryDirectory()
        #expect(
            FileManager.default.createFile(
                atPath: folder.database, contents: nil, attributes: [.posixPermissions: 0o644]))
        let store = try await HopStore.open(path: folder.database)
        try await store.storeSession(subject: "default", userID: "alice", token: "plain-text-token")
        for file in [folder.database, folder.database + "-wal", folder.database + "-shm"] {
            let mode = try #require(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int)
            #expect(mode == 0o600, "\(file) has mode \(String(mode, radix: 8))")
        }
    }

    /// A long read in another process (a backup, an operator's `sqlite3` shell) keeps the
    /// write-ahead log from being checkpointed past its snapshot, and a daemon's writes meanwhile
    /// grow the log. Once the read ends, the log is cut back to `Connection.walSizeLimit`, not
    /// kept at its largest for as long as the daemon runs.
    @Test func aWriteAheadLogThatGrewBesideALongReadIsCutBackOnceTheReadEnds() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database, options: .init(durability: .normal))
        let wal = folder.database + "-wal"
        func size() throws -> Int64 {
            Int64(try FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int ?? 0)
        }
        let reader = try ChildProcess(
            "hop-test-store", ["hold-read", folder.database], keepInputOpen: true, directory: folder)
        defer { reader.kill() }
        try await reader.waitForOutput("reading")
        let value = String(repeating: "x", count: 4000)
        var writes = 0
        // About 3,000 writes; a bound, should the log be checkpointed past the read after all.
        while try size() < 2 * Connection.walSizeLimit, writes < 30_000 {
            writes += 1
            try await store.setFact(subject: "default", key: "key-\(writes % 5000)", value: value)
        }
        let grown = try size()
        try #require(grown >= 2 * Connection.walSizeLimit, "the log kept at \(grown) bytes beside the read")
        reader.closeInput()
        #expect(try await reader.waitForExit() == 0)
        // SQLite checkpoints the whole log at the next commit, and the write after that starts
        // the log over, cutting the file back; a few more writes at the most.
        for more in 1...100 where try size() > Connection.walSizeLimit {
            try await store.setFact(subject: "default", key: "more-\(more)", value: "x")
        }
        let after = try size()
        #expect(after <= Connection.walSizeLimit, "grew to \(grown) bytes in \(writes) writes; \(after) after")
        #expect(try await store.fact(subject: "default", key: "key-1") == value)
    }

    @Test func aSymlinkADeviceAMemoryDatabaseAndAURIAreRefusedAndLeaveNothing() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        let link = folder.path("link.sqlite")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: folder.database)
        let before = try Self.files(in: folder)
        for (path, words) in [
            (link, "symbolic link"), ("/dev/null", "not a regular file"), (":memory:", "not a database file path"),
            ("file:\(folder.path("uri.sqlite"))?mode=rwc", "not a database file path"),
        ] {
            for arguments in [["status"], ["migrate"]] {
                let result = try await run("hopctl", arguments + ["--db", path], in: folder)
                #expect(result.status == 1 && result.stderr.contains(words), "\(path) \(arguments): \(result.stderr)")
                #expect(
                    !result.stderr.contains("nothing was changed") || !result.stderr.contains("disk"),
                    "\(result.stderr)")
            }
        }
        let memory = try await run("hopctl", ["status"], environment: ["HOP_DB": ":memory:"], in: folder)
        #expect(memory.status == 1 && memory.stderr.contains("not a database file path"), "\(memory.stderr)")
        #expect(
            !FileManager.default.fileExists(atPath: "/dev/null-journal") || Self.modeOf("/dev/null-journal") != 0o666)
        #expect(try Self.files(in: folder) == before, "stray files were left")
        #expect(!FileManager.default.fileExists(atPath: FileManager.default.currentDirectoryPath + "/:memory:"))
    }

    @Test func anotherUsersDatabaseIsRefusedNamingItsOwner() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        let result: (status: Int32, stdout: String, stderr: String)
        if getuid() == 0 {
            // As root, run hopctl as nobody: the database (root's, 0600) is another user's.
            try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: folder.url.path)
            result = try await run(
                "/usr/bin/setpriv",
                [
                    "--reuid=nobody", "--regid=nogroup", "--clear-groups", builtProduct("hopctl"), "status", "--db",
                    folder.database,
                ],
                in: folder)
        } else {
            try FileManager.default.setAttributes([.posixPermissions: 0o000], ofItemAtPath: folder.database)
            defer { try? FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: folder.database) }
            result = try await run("hopctl", ["status", "--db", folder.database], in: folder)
        }
        #expect(result.status == 1, "\(result.stderr)")
        #expect(result.stderr.contains("permission denied") && result.stderr.contains("sudo -u"), "\(result.stderr)")
        let owner = String(cString: getpwuid(getuid()).pointee.pw_name)
        #expect(result.stderr.contains("belongs to \(owner)"), "\(result.stderr)")
    }

    /// An operator puts a backup in the database's place (as the README's restore says, but
    /// without stopping the process that has it open), or removes the file. SQLite, in WAL mode,
    /// goes on reading and committing to the file it opened, which no other process sees any
    /// more: a write it accepted would be lost. The store commits nothing more: each write is
    /// refused `.replaced`, naming the path and saying to start the process again, and so is a
    /// look for changes (an engine's watch, which then stops the engine). The file now at the
    /// path is as it was put there.
    @Test(arguments: ["replaced", "removed"])
    func aDatabaseFileReplacedOrRemovedWhileOpenIsWrittenToNoMore(_ how: String) async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        try await store.markUsed(subject: "kiosk-7", feature: "onboarding")
        let copy = folder.path("copy.sqlite")
        _ = try await store.backup(to: copy)
        try await store.markUsed(subject: "kiosk-7", feature: "tour")  // after the backup: lost with the old file
        for suffix in ["-wal", "-shm"] { unlink(folder.database + suffix) }
        if how == "replaced" {
            #expect(rename(copy, folder.database) == 0)
        } else {
            #expect(unlink(folder.database) == 0)
        }

        for write in [
            { try await store.markUsed(subject: "kiosk-7", feature: "login") },
            { try await store.storeSession(subject: "kiosk-7", userID: "alice", token: "plain-text-token") },
        ] as [@Sendable () async throws -> Void] {
            let error = await #expect(throws: HopError.self) { try await write() }
            #expect(error?.code == .replaced, "\(String(describing: error))")
            #expect(error?.path == folder.database)
            #expect(error?.description.contains("Start the process again") == true, "\(String(describing: error))")
            #expect(error?.description.contains("plain-text-token") == false)
        }
        let looked = await #expect(throws: HopError.self) { try await store.changeVersion() }
        #expect(looked?.code == .replaced)

        if how == "replaced" {
            let now = try await HopStore.open(path: folder.database)
            #expect(try await now.firstUseFlags(subject: "kiosk-7").map(\.feature) == ["onboarding"])
            #expect(try await now.session(subject: "kiosk-7") == nil)
        } else {
            #expect(!FileManager.default.fileExists(atPath: folder.database))
        }
    }

    /// The folder's files, but for the captured output of the processes the test ran.
    private static func files(in folder: TemporaryDirectory) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: folder.url.path).filter {
            !$0.hasSuffix(".out") && !$0.hasSuffix(".err")
        }.sorted()
    }

    private static func modeOf(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions]) as? Int) ?? 0
    }
}
