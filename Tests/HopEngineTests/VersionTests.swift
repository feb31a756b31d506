import Foundation
import HopEngine
import HopTestSupport
import Logging
import Testing

/// Several versions of one flow in one engine: new runs start on the newest, unfinished runs
/// continue on their own, and a run whose version an engine lacks is left for one that has it.
@Suite struct VersionTests {
    /// Version 2 of the start-up flow: a terms step after onboarding.
    static let startupV2 = Flow("startup", version: "2") { flow in
        try await flow.hop(to: "splash")
        if try await flow.isFirstUse("onboarding") {
            try await flow.hop(to: "onboarding")
            try await flow.hop(to: "terms")
            try await flow.markUsed("onboarding")
        }
        if try await flow.session() == nil {
            try await flow.hop(to: "login")
        }
        try await flow.hop(to: "main")
    }

    static func engine(
        _ folder: TemporaryDirectory, backend: TestBackend, storage: (any HopStorage)? = nil, flows: [Flow]
    ) async throws -> HopEngine {
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let opened: any HopStorage
        if let storage { opened = storage } else { opened = try await backend.open(folder) }
        let engine = HopEngine(storage: opened, logger: logger)
        for flow in flows { engine.register(flow) }
        for step in ["splash", "terms", "main"] { engine.register(step: step) { _ in } }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        return engine
    }

    @Test(arguments: TestBackend.all)
    func aRunParkedOnVersion1FinishesOnItsPathWhileNewRunsTakeVersion2(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let old = try await Self.engine(folder, backend: backend, flows: [startupFlow(version: "1")])
        let parked = try await old.start("startup", subject: "kiosk-1")
        #expect(try await old.settled(runID: parked.id)?.currentStep == "onboarding")

        // The daemon restarts on a build with version 2 registered beside version 1.
        let new = try await Self.engine(
            folder, backend: backend, storage: old.storage, flows: [startupFlow(version: "1"), Self.startupV2])
        try await new.resumeAll()
        let fresh = try await new.start("startup", subject: "kiosk-2")
        #expect(fresh.flowVersion == "2")
        #expect(try await new.settled(runID: fresh.id)?.currentStep == "onboarding")

        try await new.storeSession(subject: "kiosk-1", userID: "alice", token: "t1")
        try await new.storeSession(subject: "kiosk-2", userID: "bob", token: "t2")
        try await new.unhop(flow: "startup", subject: "kiosk-1", step: "onboarding")
        try await new.unhop(flow: "startup", subject: "kiosk-2", step: "onboarding")
        #expect(try await new.settled(runID: parked.id)?.status == .completed)
        #expect(try await new.settled(runID: fresh.id)?.status == .completed)
        let oldPath = try await path(of: parked.id, in: new.storage).filter { $0.hasPrefix("hop") }
        let newPath = try await path(of: fresh.id, in: new.storage).filter { $0.hasPrefix("hop") }
        #expect(oldPath == ["hop splash", "hop onboarding", "hop main"], "the old run stays on version 1")
        #expect(newPath == ["hop splash", "hop onboarding", "hop terms", "hop main"], "the new run takes version 2")
    }

    @Test(arguments: TestBackend.all)
    func aRunOfAVersionThisEngineLacksIsLeftAloneUntilAnEngineWithItComes(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let storage = try await backend.open(folder)
        // A run of version 1 that was interrupted (no engine holds it).
        let (run, _) = try await storage.startRun(flow: "startup", subject: "kiosk-1", version: "1")

        let newOnly = try await Self.engine(folder, backend: backend, storage: storage, flows: [Self.startupV2])
        #expect(try await newOnly.resumeAll() == 0)
        try await newOnly.start("startup", subject: "kiosk-1")  // returns the unfinished run, does not execute it
        #expect(await !newOnly.isExecuting(runID: run.id))
        let untouched = try #require(try await storage.run(id: run.id))
        #expect(untouched.status == .running && untouched.owner == nil && untouched.flowVersion == "1")
        #expect(try await storage.history(runID: run.id).isEmpty, "not diverged, not failed, not started")

        let withV1 = try await Self.engine(
            folder, backend: backend, storage: storage, flows: [startupFlow(version: "1")])
        #expect(try await withV1.resumeAll() == 1)
        #expect(try await withV1.settled(runID: run.id)?.currentStep == "onboarding")
    }

    @Test(arguments: TestBackend.all)
    func startOnAChosenVersionAndAClearRefusalForOneNotRegistered(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let engine = try await Self.engine(
            folder, backend: backend, flows: [startupFlow(version: "1"), Self.startupV2])
        let chosen = try await engine.start("startup", subject: "kiosk-1", version: "1")
        #expect(chosen.flowVersion == "1")
        let refused = await #expect(throws: HopError.self) {
            try await engine.start("startup", subject: "kiosk-2", version: "3")
        }
        #expect(refused?.code == .notRegistered)
        #expect(refused?.description.contains("registered: 1, 2") == true, "\(String(describing: refused))")
        #expect(try await engine.storage.latestRun(flow: "startup", subject: "kiosk-2") == nil, "nothing was written")

        // Registering a version again replaces it in place: the newest stays the newest.
        engine.register(startupFlow(version: "1"))
        #expect(try await engine.start("startup", subject: "kiosk-3").flowVersion == "2")
        // A restart starts over on the newest version.
        #expect(try await engine.restart(flow: "startup", subject: "kiosk-1").flowVersion == "2")
    }
}
