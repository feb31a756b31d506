import Foundation
import HopEngine
import HopStore
import HopTestSupport
import InMemoryTracing
import Logging
import Testing
import Tracing

@Suite struct TracingTests {
    static let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// An engine over a fresh database whose spans go to `tracer`.
    func tracedEngine(
        _ folder: TemporaryDirectory, backend: TestBackend, tracer: InMemoryTracer
    ) async throws -> HopEngine {
        HopEngine(storage: try await backend.open(folder), logger: Self.quiet, configuration: .init(tracer: tracer))
    }

    /// The span's `hop.outcome`, or "none".
    func outcome(of span: FinishedInMemorySpan) -> String {
        guard case .string(let outcome)? = span.attributes.get("hop.outcome") else { return "none" }
        return outcome
    }

    @Test(arguments: TestBackend.all)
    func eachExecutionOfARunAndEachStepItEntersIsASpanWithTheRunsAttributesAndNoToken(backend: TestBackend) async throws
    {
        let folder = try TemporaryDirectory()
        let tracer = InMemoryTracer()
        let engine = try await tracedEngine(folder, backend: backend, tracer: tracer)
        engine.register(startupFlow())
        engine.register(step: "splash") { _ in
            // Work a step traces itself is a child of the step's span.
            tracer.withSpan("load assets") { _ in }
        }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        engine.register(step: "main") { _ in }

        let run = try await engine.start("startup", subject: "kiosk-7")
        #expect(try await engine.settled(runID: run.id)?.status == .parked)
        let onboarding = try #require(try await engine.inFlight(flow: "startup", subject: "kiosk-7"))
        try await engine.unhop(flow: "startup", subject: "kiosk-7", token: onboarding.token)
        #expect(try await engine.settled(runID: run.id)?.status == .parked)
        let secret = "session-token-\(UUID().uuidString)"
        try await engine.storeSession(subject: "kiosk-7", userID: "alice", token: secret)
        #expect(try await engine.settled(runID: run.id)?.status == .completed)

        let spans = tracer.finishedSpans
        let runSpans = spans.filter { $0.operationName == "run startup" }
        #expect(runSpans.map { $0.attributes.get("hop.outcome") } == ["parked", "parked", "completed"])
        // Each execution replays the entries before it: splash's hop and unhop, the first-use
        // decision, onboarding's hop and unhop; then the effect, the session decision, login's.
        #expect(runSpans.map { $0.attributes.get("hop.replayed") } == [0, 5, 9])
        for span in runSpans {
            #expect(span.attributes.get("hop.flow") == "startup")
            #expect(span.attributes.get("hop.subject") == "kiosk-7")
            #expect(span.attributes.get("hop.run_id") == .int64(run.id))
            #expect(span.attributes.get("hop.flow_version") == "1")
            #expect(span.errors.isEmpty && span.status == nil)
        }

        let stepSpans = spans.filter { $0.operationName.hasPrefix("step ") }
        #expect(
            stepSpans.map { "\($0.operationName) \(outcome(of: $0))" } == [
                "step splash unhopped", "step onboarding parked", "step login parked", "step main unhopped",
            ])
        let executionOf = [0, 0, 1, 2]  // the run span each step's span belongs to
        for (stepSpan, execution) in zip(stepSpans, executionOf) {
            #expect(stepSpan.parentSpanID == runSpans[execution].spanID)
            #expect(stepSpan.traceID == runSpans[execution].traceID)
            #expect(stepSpan.attributes.get("hop.run_id") == .int64(run.id))
            #expect(stepSpan.attributes.get("hop.step") == .string(String(stepSpan.operationName.dropFirst(5))))
        }
        let assets = try #require(spans.first { $0.operationName == "load assets" })
        #expect(assets.parentSpanID == stepSpans[0].spanID)

        // No token, the session's or a hop's, is in any attribute, event or error of any span.
        var tokens = [secret, onboarding.token]
        for entry in try await engine.storage.history(runID: run.id) {
            if let token = entry.token { tokens.append(token) }
        }
        for span in spans {
            let text = "\(span.attributes) \(span.events) \(span.errors.map { "\($0.error)" })"
            for token in tokens { #expect(!text.contains(token), "\(span.operationName) shows a token") }
        }
        #expect(tracer.activeSpans.isEmpty, "every span ended")
    }

    @Test(arguments: TestBackend.all)
    func aFailingStepsSpanRecordsEachAttemptsErrorAndFailsWithTheRunsSpan(backend: TestBackend) async throws {
        struct DeviceOffline: Error {}
        let folder = try TemporaryDirectory()
        let tracer = InMemoryTracer()
        let engine = try await tracedEngine(folder, backend: backend, tracer: tracer)
        engine.register(
            Flow("provision", version: "1") { flow in
                try await flow.hop(to: "register")
            })
        engine.register(step: "register", retry: RetryPolicy(maxAttempts: 3, initialBackoff: .milliseconds(1))) { _ in
            throw DeviceOffline()
        }
        let run = try await engine.start("provision", subject: "device-1")
        #expect(try await engine.settled(runID: run.id)?.status == .failed)

        let step = try #require(tracer.finishedSpans.first { $0.operationName == "step register" })
        #expect(step.attributes.get("hop.outcome") == "failed")
        #expect(step.attributes.get("hop.attempts") == 3)
        #expect(step.errors.count == 3, "attempts 1 and 2, then the step's failure")
        #expect(step.errors.prefix(2).allSatisfy { $0.error is DeviceOffline })
        #expect((step.errors.last?.error as? HopError)?.code == .stepFailed)
        #expect(step.status?.code == .error)
        let execution = try #require(tracer.finishedSpans.first { $0.operationName == "run provision" })
        #expect(step.parentSpanID == execution.spanID)
        #expect(execution.attributes.get("hop.outcome") == "failed")
        #expect(execution.status?.code == .error)
        #expect((execution.errors.first?.error as? HopError)?.code == .stepFailed)
    }

    @Test(arguments: TestBackend.all)
    func aStepThatOverrunsItsDeadlineEndsItsSpanTimedOutAndTheRunGoesOn(backend: TestBackend) async throws {
        let folder = try TemporaryDirectory()
        let tracer = InMemoryTracer()
        let engine = try await tracedEngine(folder, backend: backend, tracer: tracer)
        engine.register(
            Flow("startup", version: "1") { flow in
                if try await flow.hop(to: "splash", timeout: .milliseconds(50)).timedOut {
                    try await flow.hop(to: "offline")
                }
            })
        engine.register(step: "splash") { _ in try await Task.sleep(for: .seconds(600)) }
        engine.register(step: "offline") { _ in }
        let run = try await engine.start("startup")
        #expect(try await engine.settled(runID: run.id)?.status == .completed)

        let outcomes = tracer.finishedSpans.map { "\($0.operationName) \(outcome(of: $0))" }
        #expect(outcomes == ["step splash timed_out", "step offline unhopped", "run startup completed"])
        #expect(tracer.finishedSpans.allSatisfy { $0.errors.isEmpty })
    }
}
