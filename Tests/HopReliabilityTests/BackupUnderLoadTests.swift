import Foundation
import HopStore
import HopTestSupport
import Synchronization
import Testing

/// Backups taken while four hopctl operators steer a daemon's 100 runs (the soak test's commands),
/// restored into a fresh folder where a daemon resumes every run and each one completes.
@Suite struct BackupUnderLoadTests {
    @Test func backupsTakenUnderTheSoakWorkloadHoldEveryAcknowledgedUnhopAndRestoreToRunsThatAllComplete()
        async throws
    {
        let folder = try TemporaryDirectory()
        let subjects = 100
        let daemon = try ChildProcess(
            "hop-test-daemon", ["--db", folder.database, "--external", "--reroute", "--subjects", "\(subjects)"],
            keepInputOpen: true, directory: folder)
        defer { daemon.kill() }
        try await daemon.waitForOutput("started \(subjects)", timeout: .seconds(120))
        let hopctl = builtProduct("hopctl")
        let database = folder.database
        // The subjects whose onboarding unhop hopctl acknowledged (exit 0), as they come.
        let acknowledged = Acknowledged()

        // Four operators: each unhops its subjects' onboarding, then logs in and out, resets
        // first use and reads, as the soak test's operators do.
        let operators = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<SoakTests.workers {
                    group.addTask {
                        let mine = stride(from: worker, to: subjects, by: SoakTests.workers).map { "user-\($0)" }
                        try await onThread {
                            for subject in mine {
                                try hopctlRetryingBusy(
                                    hopctl,
                                    ["unhop", "--flow", "startup", "--step", "onboarding", "--subject", subject],
                                    database: database, scratch: folder.path("worker-\(worker)"))
                                acknowledged.subjects.withLock { _ = $0.insert(subject) }
                            }
                            for round in SoakTests.rounds where round != ["status"] {
                                for subject in mine {
                                    try hopctlRetryingBusy(
                                        hopctl,
                                        round + ["--subject", subject]
                                            + (round == ["history"] ? ["--flow", "startup"] : []),
                                        database: database, scratch: folder.path("worker-\(worker)"))
                                }
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
        }

        // Backups while they work, each checked against what was acknowledged before it began.
        var backups: [(path: String, before: Set<String>)] = []
        for index in 0..<3 {
            try await waitUntil("operators acknowledged more unhops", timeout: .seconds(120)) {
                acknowledged.subjects.withLock { $0.count } >= (index + 1) * subjects / 4
            }
            let before = acknowledged.subjects.withLock { $0 }
            let target = folder.path("backup-\(index).sqlite")
            let backup = try await run("hopctl", ["backup", target, "--db", database], in: folder)
            #expect(backup.status == 0, "\(backup.stderr)")
            #expect(
                backup.stdout.contains("backed up \(subjects) runs") && backup.stdout.contains("integrity_check ok"))
            backups.append((target, before))
        }
        #expect(backups[0].before.count < subjects, "the first backup was taken while operators were at work")
        try await operators.value
        daemon.closeInput()
        #expect(try await daemon.waitForExit(timeout: .seconds(60)) == 0)

        // Every backup holds every unhop acknowledged before it began, once.
        var copies: [TemporaryDirectory] = []
        for (path, before) in backups {
            let copy = try TemporaryDirectory()
            try FileManager.default.copyItem(atPath: path, toPath: copy.database)
            let store = try await HopStore.open(path: copy.database)
            for subject in before {
                let run = try #require(try await store.latestRun(flow: "startup", subject: subject))
                let unhops = try await store.history(runID: run.id).filter {
                    $0.kind == .unhop && $0.step == "onboarding"
                }
                #expect(unhops.count == 1, "\(path): \(subject)'s acknowledged unhop of onboarding")
            }
            copies.append(copy)
        }

        // Restore the middle one (runs at every step): the daemon stopped, the copy in place of its
        // database in a fresh folder, a daemon started on it.
        do {
            let restored = copies[1]
            let store = try await HopStore.open(path: restored.database)
            let resumed = try ChildProcess(
                "hop-test-daemon",
                ["--db", restored.database, "--external", "--reroute", "--subjects", "\(subjects)"],
                keepInputOpen: true, directory: restored)
            defer { resumed.kill() }
            try await resumed.waitForOutput("started \(subjects)", timeout: .seconds(120))
            #expect(try await store.runs(flow: "startup", limit: 2 * subjects).count == subjects, "runs started over")
            try await Self.complete(subjects: subjects, in: restored, store: store, hopctl: hopctl)
            for run in try await store.runs(flow: "startup", limit: subjects) {
                let history = try await store.history(runID: run.id)
                #expect(history.map(\.seq) == Array(1...Int64(history.count)), "run \(run.id): sequence numbers")
                #expect(history.filter { $0.kind == .unhop && $0.step == "onboarding" }.count == 1)
                let ends = history.filter { $0.kind.endsStep }.compactMap(\.token)
                #expect(Set(ends).count == ends.count, "run \(run.id): a hop ended twice")
            }
            #expect(try await store.integrityCheck() == ["ok"])
            resumed.closeInput()
            #expect(try await resumed.waitForExit(timeout: .seconds(60)) == 0)
            #expect(resumed.stderr.isEmpty, "the restored daemon logged errors: \(resumed.stderr.prefix(2000))")
        }
    }

    /// Drives every restored run to its end: onboarding unhopped, logged in, main unhopped (with
    /// `--reroute`, main is external: no run completes while the operators work, so the restored
    /// daemon resumes every run rather than starting any over).
    static func complete(subjects: Int, in folder: TemporaryDirectory, store: HopStore, hopctl: String) async throws {
        let names = (0..<subjects).map { "user-\($0)" }
        func steer(_ arguments: [String], _ subject: String) throws {
            try hopctlRetryingBusy(
                hopctl, arguments + ["--subject", subject], database: folder.database, scratch: folder.path("steer"))
        }
        for subject in names
        where try await store.latestRun(flow: "startup", subject: subject)?.currentStep == "onboarding" {
            try steer(["unhop", "--flow", "startup", "--step", "onboarding"], subject)
        }
        for subject in names where try await store.session(subject: subject) == nil {
            try steer(["session", "login", "alice"], subject)
        }
        try await waitUntil("every restored run is parked at main", timeout: .seconds(60)) {
            try await store.runs(flow: "startup", limit: subjects).allSatisfy {
                $0.status == .parked && $0.currentStep == "main"
            }
        }
        for subject in names { try steer(["unhop", "--flow", "startup", "--step", "main"], subject) }
        try await waitUntil("every restored run completes", timeout: .seconds(60)) {
            try await store.runs(flow: "startup", limit: subjects).allSatisfy { $0.status == .completed }
        }
    }
}

/// The subjects whose onboarding unhop hopctl acknowledged, shared by the operator threads.
final class Acknowledged: Sendable {
    let subjects = Mutex(Set<String>())
}
