import CSQLite
import Foundation
import HopStoreTestSupport
import Testing

@testable import HopStore

@Suite struct MigrationTests {
    @Test func aFreshFileGetsEverySchemaVersionRecordedWithItsChecksum() async throws {
        let folder = try TemporaryDirectory()
        let store = try await HopStore.open(path: folder.database)
        #expect(store.schemaVersion == Migration.latestVersion)
        #expect(Migration.latestVersion >= 2)
        let recorded = try await store.appliedMigrations()
        #expect(recorded.map(\.version) == Migration.all.map(\.version))
        #expect(recorded.map(\.checksum) == Migration.all.map(\.checksum))
    }

    @Test func embeddedMigrationsAreTheFilesOfMigrationsFolderVerbatim() throws {
        let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
            "../../Migrations"
        ).standardized
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }
            .sorted()
        #expect(files.count == Migration.all.count)
        for (file, migration) in zip(files, Migration.all) {
            #expect(file == String(format: "%04d_%@.sql", migration.version, migration.name))
            #expect(try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8) == migration.sql)
        }
    }

    @Test func checksumIsTheSHA256ThatSha256sumPrints() {
        #expect(SHA256.hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(SHA256.hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            SHA256.hex(String(repeating: "a", count: 1000))
                == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3")
    }

    @Test(arguments: 1..<Migration.latestVersion)
    func upgradeFromEarlierVersionKeepsTheData(from version: Int) async throws {
        let folder = try TemporaryDirectory()
        var old = HopStore.Options()
        old.migrations = Array(Migration.all.prefix(version))
        let before = try await HopStore.open(path: folder.database, options: old)
        #expect(before.schemaVersion == version)
        // Rows as that version's schema holds them, written with SQL of that time.
        try rawSQL(
            folder.database,
            """
            INSERT INTO runs (id, flow, subject, flow_version, status, current_step, current_token, created_at, updated_at)
                VALUES (7, 'startup', 'kiosk-7', '1', 'running', 'splash', 'tok', 1, 1);
            INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (7, 1, 'hop', 'splash', 'tok', NULL, 1);
            """)
        let run = (id: Int64(7), ())

        let after = try await HopStore.open(path: folder.database)
        #expect(after.schemaVersion == Migration.latestVersion)
        #expect(try await after.history(runID: run.id).map(\.step) == ["splash"])
        #expect(try await after.run(id: run.id)?.currentStep == "splash")
        try await after.recordUnhop(runID: run.id, token: "tok")
        try await after.markUsed(subject: "kiosk-7", feature: "onboarding")
        #expect(try await after.isFirstUse(subject: "kiosk-7", feature: "onboarding") == false)
        #expect(try await after.integrityCheck() == ["ok"])
    }

    @Test func theHistoryAcceptsEveryKindTheStoreWritesAndRefusesOthers() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        try rawSQL(
            folder.database,
            "INSERT INTO runs (id, flow, subject, flow_version, status, created_at, updated_at) VALUES (1, 'f', 's', '1', 'running', 0, 0)"
        )
        for (seq, kind) in HistoryKind.allCases.enumerated() {
            try rawSQL(
                folder.database,
                "INSERT INTO history (run_id, seq, kind, at) VALUES (1, \(seq + 1), '\(kind.rawValue)', 0)")
        }
        for kind in ["bogus", "Hop", "hop ", ""] {
            let refusal = #expect(throws: TestFailure.self, "\(kind)") {
                try rawSQL(
                    folder.database, "INSERT INTO history (run_id, seq, kind, at) VALUES (1, 1000, '\(kind)', 0)")
            }
            #expect(
                refusal?.description.contains("CHECK constraint failed") == true,
                "\(kind): \(String(describing: refusal))")
        }
    }

    private func rawSQL(_ path: String, _ sql: String) throws {
        var db: OpaquePointer?
        defer { sqlite3_close(db) }
        // The store that made the file may still be closing it (its last connection checkpoints
        // the log under an exclusive lock): wait for it as the store's own connections do.
        guard sqlite3_open(path, &db) == SQLITE_OK, sqlite3_busy_timeout(db, 5_000) == SQLITE_OK,
            sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK
        else {
            throw TestFailure("raw SQL failed: \(String(cString: sqlite3_errmsg(db)))")
        }
    }

    @Test func databaseFromANewerHopIsRefusedAndLeftUnchanged() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        var older = HopStore.Options()
        older.migrations = Array(Migration.all.dropLast())
        let error = await #expect(throws: HopError.self) {
            _ = try await HopStore.open(path: folder.database, options: older)
        }
        #expect(error?.code == .schemaTooNew)
        #expect(error?.description.contains("schema version \(Migration.latestVersion)") == true)
        #expect(error?.description.contains("versions up to \(Migration.latestVersion - 1)") == true)
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.appliedMigrations().count == Migration.latestVersion)
    }

    @Test func anAppliedMigrationThatWasEditedIsRefused() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        var edited = HopStore.Options()
        edited.migrations[0].sql += "\n-- an edit\n"
        let error = await #expect(throws: HopError.self) {
            _ = try await HopStore.open(path: folder.database, options: edited)
        }
        #expect(error?.code == .migrationEdited)
        #expect(error?.description.contains("migration 1 (initial)") == true)
    }

    @Test func openingWithoutMigratingRefusesAnOutdatedSchema() async throws {
        let folder = try TemporaryDirectory()
        var old = HopStore.Options()
        old.migrations = Array(Migration.all.prefix(1))
        _ = try await HopStore.open(path: folder.database, options: old)
        let error = await #expect(throws: HopError.self) {
            _ = try await HopStore.open(
                path: folder.database, options: HopStore.Options(createIfMissing: false, migrate: false))
        }
        #expect(error?.code == .schemaOutdated)
        #expect(error?.description.contains("hopctl migrate") == true)
    }

    @Test func openingACurrentDatabaseNeedsNoWriteLock() async throws {
        let folder = try TemporaryDirectory()
        _ = try await HopStore.open(path: folder.database)
        let holder = try ChildProcess(
            "hop-test-store", ["hold-lock", folder.database], keepInputOpen: true, directory: folder)
        defer { holder.kill() }
        try await holder.waitForOutput("locked")

        // Another process holds the write lock: a daemon or hopctl still opens the database and reads.
        let store = try await HopStore.open(path: folder.database, options: .init(busyTimeout: .milliseconds(100)))
        #expect(store.schemaVersion == Migration.latestVersion)
        #expect(try await store.session(subject: "default") == nil)
        // A database that needs migrating does wait for the lock, and says so when it cannot get it.
        var newer = HopStore.Options(busyTimeout: .milliseconds(100))
        newer.migrations.append(
            Migration(version: Migration.latestVersion + 1, name: "future", sql: "CREATE TABLE future (x)"))
        let error = await #expect(throws: HopError.self) {
            try await HopStore.open(path: folder.database, options: newer)
        }
        #expect(error?.code == .busy, "\(String(describing: error))")
        holder.closeInput()
        #expect(try await holder.waitForExit() == 0)
    }

    @Test func processesMigratingOneFreshFileAtOnceAllSucceedAndApplyTheSchemaOnce() async throws {
        let folder = try TemporaryDirectory()
        let children = try (0..<4).map { _ in
            try ChildProcess("hop-test-store", ["migrate", folder.database], directory: folder)
        }
        for child in children {
            let status = try await child.waitForExit()
            #expect(status == 0, "stderr: \(child.stderr)")
            #expect(child.stdout == "schema \(Migration.latestVersion)\n")
        }
        let store = try await HopStore.open(path: folder.database)
        #expect(try await store.appliedMigrations().map(\.version) == Migration.all.map(\.version))
        #expect(try await store.integrityCheck() == ["ok"])
    }
}
