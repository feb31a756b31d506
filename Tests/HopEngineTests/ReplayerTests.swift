import Foundation
import HopEngine
import HopTestSupport
import HopTesting
import Logging
import Testing

/// HopTesting's replayer: recorded histories replayed against new flow code before it is deployed.
@Suite struct ReplayerTests {
    /// The demo's start-up flow, as `Examples/StartupDaemon/StartupFlow.swift` has it.
    static let demoFlow = Flow("startup", version: "1", variants[0])

    /// Version 2: a terms step after onboarding, added without a patch.
    static let termsUnpatched = Flow("startup", version: "2", variants[4])

    /// Version 2 done right: the terms step behind a patch.
    static let termsPatched = Flow("startup", version: "2", variants[5])

    @Test(arguments: TestBackend.all)
    func theDemosRecordedHistoriesReplayedAgainstVersion2CatchTheUnpatchedChange(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let db = try await backend.location(folder)
        // One run completes; another is left parked at onboarding.
        let done = try await run("hop-demo", ["--auto", "--db", db, "--subject", "kiosk-1"], in: folder)
        #expect(done.status == 0, "\(done.stdout)\(done.stderr)")
        let parked = try ChildProcess(
            "hop-demo", ["--db", db, "--subject", "kiosk-2"], directory: folder)
        try await parked.waitForOutput("parked at onboarding")
        parked.kill(SIGTERM)
        _ = try await parked.waitForExit()

        let export = try await run(
            "hopctl", ["history", "--flow", "startup", "--all-runs", "--json", "--db", db], in: folder)
        #expect(export.status == 0, "\(export.stderr)")
        let recorded = Data(export.stdout.utf8)

        let unchanged = try await HistoryReplayer.replay(Self.demoFlow, againstJSON: recorded)
        #expect(unchanged.count == 2 && unchanged.allSatisfy { $0.isCompatible }, "\(unchanged)")

        let caught = try await HistoryReplayer.replay(Self.termsUnpatched, againstJSON: recorded)
        let incompatible = caught.filter { !$0.isCompatible }
        #expect(incompatible.map(\.subject) == ["kiosk-1"], "\(caught)")
        let report = try #require(incompatible.first)
        #expect(
            report.description.contains("its history recorded effect 'markUsed(onboarding)'")
                && report.description.contains("asks for hop to 'terms'"), "\(report)")
        #expect(caught.first { $0.subject == "kiosk-2" }?.isCompatible == true, "parked before the change")

        let patched = try await HistoryReplayer.replay(Self.termsPatched, againstJSON: recorded)
        #expect(patched.allSatisfy { $0.isCompatible }, "\(patched)")
    }

    typealias Body = @Sendable (FlowContext) async throws -> Void

    /// Bodies of the start-up flow: the demo's, and changes of it. Each is registered as version 1
    /// for the engine and replayed as version 1 by the replayer, over the same recorded histories.
    static let variants: [Body] = [
        { flow in
            try await flow.hop(to: "splash")
            if try await flow.isFirstUse("onboarding") {
                try await flow.hop(to: "onboarding")
                try await flow.markUsed("onboarding")
            }
            if try await flow.session() == nil { try await flow.hop(to: "login") }
            try await flow.hop(to: "main")
        },
        { flow in
            try await flow.hop(to: "splash")
            try await flow.hop(to: "main")
        },
        { flow in
            try await flow.hop(to: "splash")
            if try await flow.isFirstUse("onboarding") { try await flow.hop(to: "onboarding") }
            try await flow.hop(to: "main")
        },
        { flow in
            try await flow.hop(to: "splash")
            _ = try await flow.session()
            if try await flow.isFirstUse("onboarding") {
                try await flow.hop(to: "onboarding")
                try await flow.markUsed("onboarding")
            }
            try await flow.hop(to: "main")
        },
        { flow in
            try await flow.hop(to: "splash")
            if try await flow.isFirstUse("onboarding") {
                try await flow.hop(to: "onboarding")
                try await flow.hop(to: "terms")
                try await flow.markUsed("onboarding")
            }
            if try await flow.session() == nil { try await flow.hop(to: "login") }
            try await flow.hop(to: "main")
        },
        { flow in
            try await flow.hop(to: "splash")
            if try await flow.isFirstUse("onboarding") {
                try await flow.hop(to: "onboarding")
                if try await flow.patched("terms-screen") { try await flow.hop(to: "terms") }
                try await flow.markUsed("onboarding")
            }
            if try await flow.session() == nil { try await flow.hop(to: "login") }
            try await flow.hop(to: "main")
        },
    ]

    @Test(arguments: TestBackend.all)
    func theReplayerReportsEveryDivergenceTheEngineFindsInTheSameWords(backend: TestBackend) async throws {
        for (index, variant) in Self.variants.enumerated() {
            let folder = try TemporaryDirectory()
            let storage = try await backend.open(folder)
            // Runs recorded by the demo's code: in flight at onboarding, at login, and completed.
            let recorder = Self.engine(storage, Self.demoFlow)
            var runs: [RunRecord] = []
            for (subject, moves) in [("at-onboarding", 0), ("at-login", 1), ("done", 2)] {
                let run = try await recorder.start("startup", subject: subject)
                _ = try await recorder.settled(runID: run.id)
                if moves >= 1 { try await recorder.unhop(flow: "startup", subject: subject, step: "onboarding") }
                if moves >= 2 { try await recorder.storeSession(subject: subject, userID: "u", token: "t") }
                runs.append(try #require(try await recorder.settled(runID: run.id)))
            }
            // The replayer's verdicts, before the engine moves anything.
            var verdicts: [Int64: ReplayReport] = [:]
            for run in runs {
                let history = try await storage.history(runID: run.id)
                let recorded = RecordedRun(
                    runID: run.id, flow: run.flow, subject: run.subject, version: run.flowVersion, status: run.status,
                    entries: history)
                verdicts[run.id] = await HistoryReplayer.replay(
                    Flow("startup", version: "1", variant), against: [recorded]
                ).first
            }
            // The engine's verdicts: every unfinished run executed again on the variant's code.
            let judge = Self.engine(storage, Flow("startup", version: "1", variant))
            for run in runs where run.status.isUnfinished {
                try await judge.storeSession(subject: run.subject, userID: "u", token: "t")
                if run.currentStep == "onboarding" {
                    try await judge.unhop(flow: "startup", subject: run.subject, step: "onboarding")
                }
                let settled = try #require(try await judge.settled(runID: run.id))
                let report = try #require(verdicts[run.id])
                let divergence = try await storage.history(runID: run.id).first { $0.kind == .diverge }?.value
                if let divergence {
                    guard case .diverged(let entry, let message) = report.verdict else {
                        Issue.record(
                            "variant \(index), \(run.subject): the engine found \(divergence); the replayer \(report)")
                        continue
                    }
                    #expect(message == divergence, "variant \(index), \(run.subject)")
                    #expect(entry != nil && divergence.contains("(history entry \(entry ?? 0))"), "\(divergence)")
                } else {
                    #expect(report.isCompatible, "variant \(index), \(run.subject): \(settled.status); \(report)")
                }
            }
        }
    }

    static func engine(_ storage: any HopStorage, _ flow: Flow) -> HopEngine {
        let engine = HopEngine(
            storage: storage, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(flow)
        for step in ["splash", "terms", "main"] { engine.register(step: step) { _ in } }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        return engine
    }
}
