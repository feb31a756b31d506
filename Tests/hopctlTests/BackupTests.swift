import Foundation
import HopStore
import HopStoreTestSupport
import HopTestSupport
import Testing

@Suite struct BackupTests {
    @Test func aBackupTakenWhileADaemonIsSteeredIsPrivateCheckedAndEveryRunResumesFromIt() async throws {
        let folder = try TemporaryDirectory()
        let subjects = (0..<20).map { "user-\($0)" }
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--subjects", "20"], keepInputOpen: true,
            directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("started 20", timeout: .seconds(60))

        // Operators move half the runs on while the copy is taken.
        let steering = Task {
            for subject in subjects.prefix(10) {
                let unhop = try await hopctl(
                    ["unhop", "--flow", "startup", "--subject", subject, "--step", "onboarding"], in: folder)
                #expect(unhop.status == 0, "\(unhop.stderr)")
            }
        }
        let target = folder.path("backup.sqlite")
        let backup = try await hopctl(["backup", target], in: folder)
        try await steering.value
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(backup.stdout.contains("backed up 20 runs") && backup.stdout.contains("integrity_check ok"))
        var info = stat()
        #expect(stat(target, &info) == 0 && info.st_mode & 0o777 == 0o600)

        // A second backup to the same path is refused and leaves the first as it was.
        let again = try await hopctl(["backup", target], in: folder)
        #expect(again.status == 1 && again.stderr.contains("a backup never overwrites a file"), "\(again.stderr)")
        #expect(stat(target, &info) == 0 && info.st_size > 0)
        // A folder is not taken for a file that exists.
        let toFolder = try await hopctl(["backup", folder.url.path], in: folder)
        #expect(toFolder.status == 1 && toFolder.stderr.contains("the path is a folder"), "\(toFolder.stderr)")
        #expect(toFolder.stderr.contains("Name a new file in it"), "\(toFolder.stderr)")

        // Restore: the daemon stopped, the copy in place of its database, a daemon started on it.
        daemon.kill()
        try await daemon.waitForExit()
        let restored = try TemporaryDirectory()
        try FileManager.default.copyItem(atPath: target, toPath: restored.database)
        let resumed = try ChildProcess(
            "hop-test-daemon", ["--db", restored.database, "--external", "--subjects", "20"], keepInputOpen: true,
            directory: restored)
        defer { resumed.kill() }
        try await resumed.waitForOutput("started 20", timeout: .seconds(60))
        let store = try await HopStore.open(path: restored.database)
        #expect(try await store.runs().count == 20, "the restored daemon started runs over instead of resuming them")
        for subject in subjects {
            if try await store.latestRun(flow: "startup", subject: subject)?.currentStep == "onboarding" {
                let unhop = try await hopctl(
                    ["unhop", "--flow", "startup", "--subject", subject, "--step", "onboarding"], in: restored)
                #expect(unhop.status == 0, "\(unhop.stderr)")
            }
            let login = try await hopctl(["session", "login", "alice", "--subject", subject], in: restored)
            #expect(login.status == 0, "\(login.stderr)")
        }
        try await waitUntil("every restored run completes", timeout: .seconds(30)) {
            try await store.runs().allSatisfy { $0.status == .completed }
        }
        #expect(try await store.runs().count == 20)
    }
}
