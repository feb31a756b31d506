import Foundation
import HopEngine
import HopTestSupport
import Logging
import Testing

/// `flow.patched(name)`: a change inside one version's code that runs in flight survive.
@Suite struct PatchTests {
    /// The code before the patch: onboarding, then login.
    static let before = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        try await flow.hop(to: "onboarding")
        try await flow.hop(to: "login")
        try await flow.hop(to: "main")
    }

    /// The same version with a terms step after onboarding, behind a patch.
    static let after = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        try await flow.hop(to: "onboarding")
        if try await flow.patched("terms-screen") {
            try await flow.hop(to: "terms")
        }
        try await flow.hop(to: "login")
        try await flow.hop(to: "main")
    }

    /// The patch retired: its call and old branch deleted.
    static let retired = Flow("startup", version: "1") { flow in
        try await flow.hop(to: "splash")
        try await flow.hop(to: "onboarding")
        try await flow.hop(to: "terms")
        try await flow.hop(to: "login")
        try await flow.hop(to: "main")
    }

    static func engine(_ storage: any HopStorage, _ flow: Flow) -> HopEngine {
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(flow)
        for step in ["splash", "terms", "main"] { engine.register(step: step) { _ in } }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external)
        return engine
    }

    static func hops(_ runID: Int64, _ storage: any HopStorage) async throws -> [String] {
        try await storage.history(runID: runID).filter { $0.kind == .hop || $0.kind == .patch }.map {
            $0.kind == .patch ? "patch \($0.step ?? "")" : $0.step ?? ""
        }
    }

    @Test(arguments: TestBackend.all)
    func runsPastThePatchKeepTheOldBranchAndTheOthersTakeTheNewOneAcrossARestart(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        // Before the patch: 50 runs parked at login (past the patch's place), 50 at onboarding.
        let old = Self.engine(storage, Self.before)
        var pastIt: [Int64] = []
        var beforeIt: [Int64] = []
        for index in 0..<100 {
            let run = try await old.start("startup", subject: "old-\(index)")
            _ = try await old.settled(runID: run.id)
            if index < 50 {
                try await old.unhop(flow: "startup", subject: "old-\(index)", step: "onboarding")
                #expect(try await old.settled(runID: run.id)?.currentStep == "login")
                pastIt.append(run.id)
            } else {
                beforeIt.append(run.id)
            }
        }

        // The patched build: new runs take the new branch; one parks at login after it.
        let patched = Self.engine(storage, Self.after)
        let fresh = try await patched.start("startup", subject: "new-0")
        _ = try await patched.settled(runID: fresh.id)
        try await patched.unhop(flow: "startup", subject: "new-0", step: "onboarding")
        #expect(try await patched.settled(runID: fresh.id)?.currentStep == "login")

        // Restarted on the same build: everything moves on.
        let restarted = Self.engine(storage, Self.after)
        for (index, runID) in beforeIt.enumerated() {
            try await restarted.unhop(flow: "startup", subject: "old-\(index + 50)", step: "onboarding")
            #expect(try await restarted.settled(runID: runID)?.currentStep == "login")
        }
        for (subject, runID) in zip((0..<100).map { "old-\($0)" } + ["new-0"], pastIt + beforeIt + [fresh.id]) {
            try await restarted.unhop(flow: "startup", subject: subject, step: "login")
            #expect(try await restarted.settled(runID: runID)?.status == .completed, "\(subject)")
        }
        for runID in pastIt {
            #expect(try await Self.hops(runID, storage) == ["splash", "onboarding", "login", "main"])
        }
        // A run parked before the patch's place reaches it as new code: it takes the new branch.
        for runID in beforeIt + [fresh.id] {
            #expect(
                try await Self.hops(runID, storage) == [
                    "splash", "onboarding", "patch terms-screen", "terms", "login", "main",
                ]
            )
        }
    }

    @Test(arguments: TestBackend.all)
    func aRetiredPatchsMarkersArePassedOverByRunsThatTookItsNewBranch(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let patched = Self.engine(storage, Self.after)
        let run = try await patched.start("startup", subject: "kiosk-1")
        _ = try await patched.settled(runID: run.id)
        try await patched.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
        #expect(try await patched.settled(runID: run.id)?.currentStep == "login")

        let retired = Self.engine(storage, Self.retired)
        try await retired.unhop(flow: "startup", subject: "kiosk-1", step: "login")
        #expect(try await retired.settled(runID: run.id)?.status == .completed)
    }

    @Test(arguments: TestBackend.all)
    func hopctlListsThePatchesAndTheRunsThatMayStillNeedAnOldBranch(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        let old = Self.engine(storage, Self.before)
        let oldRun = try await old.start("startup", subject: "old")
        _ = try await old.settled(runID: oldRun.id)
        try await old.unhop(flow: "startup", subject: "old", step: "onboarding")
        _ = try await old.settled(runID: oldRun.id)
        let patched = Self.engine(storage, Self.after)
        let newRun = try await patched.start("startup", subject: "new")
        _ = try await patched.settled(runID: newRun.id)
        try await patched.unhop(flow: "startup", subject: "new", step: "onboarding")
        _ = try await patched.settled(runID: newRun.id)

        let hopctl = ["--db", try await backend.location(folder), "--flow", "startup"]
        let list = try await run("hopctl", ["patches"] + hopctl + ["--json"], in: folder)
        #expect(list.status == 0, "\(list.stderr)")
        let patches = try #require(JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]])
        #expect(patches.count == 1 && patches.first?["patch"] as? String == "terms-screen")
        #expect(patches.first?["runs"] as? Int == 1 && patches.first?["unfinished_without"] as? Int == 1)

        let waiting = try await run("hopctl", ["patches", "--patch", "terms-screen"] + hopctl, in: folder)
        #expect(waiting.status == 0 && waiting.stdout.contains("old"), "\(waiting.stdout)\(waiting.stderr)")
        try await patched.unhop(flow: "startup", subject: "old", step: "login")
        #expect(try await patched.settled(runID: oldRun.id)?.status == .completed)
        let none = try await run("hopctl", ["patches", "--patch", "terms-screen"] + hopctl, in: folder)
        #expect(
            none.status == 0 && (none.stdout + none.stderr).contains("can be deleted"), "\(none.stdout)\(none.stderr)")

        let history = try await run("hopctl", ["history", "--subject", "new"] + hopctl, in: folder)
        #expect(history.stdout.contains("patch") && history.stdout.contains("terms-screen"), "\(history.stdout)")
    }
}
