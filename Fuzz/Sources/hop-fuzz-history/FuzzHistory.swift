// libFuzzer target: a run's stored history, as arbitrary as the schema allows (any order of
// entries, any steps, tokens and values), is decoded and replayed by the engine against the
// start-up flow. Whatever the bytes, the engine must settle the run (complete, park, fail or
// diverge) without crashing or hanging, and text read as JSON must be refused cleanly.
import CSQLiteFuzz
import Foundation
import HopEngine
import HopStore
import Logging

private let kinds = [
    "hop", "unhop", "decision", "effect", "transition", "error", "cancel", "restart", "complete", "fail", "diverge",
    "reroute", "timer", "timeout", "takeover", "patch",
]
private let steps = ["splash", "onboarding", "login", "main", "isFirstUse(onboarding)", "session", "markUsed(onboarding)", "sleep"]

/// What the fuzzer's bytes describe.
private struct Input {
    var bytes: [UInt8]
    var index = 0

    mutating func byte() -> UInt8? {
        guard index < bytes.count else { return nil }
        defer { index += 1 }
        return bytes[index]
    }

    mutating func text(maxLength: Int) -> String {
        let length = Int(byte() ?? 0) % (maxLength + 1)
        var scalars: [UInt8] = []
        for _ in 0..<length { scalars.append(byte() ?? 0) }
        return String(decoding: scalars, as: UTF8.self)
    }
}

private final class Harness: @unchecked Sendable {
    // @unchecked: created once and then used by one fuzzer iteration at a time.
    let path: String
    let raw: OpaquePointer
    let engine: HopEngine

    init() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("hop-fuzz-\(getpid()).sqlite").path
        self.path = path
        try? FileManager.default.removeItem(atPath: path)
        let semaphore = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var opened: Result<HopStore, any Error>?
        Task {
            do {
                opened = .success(try await HopStore.open(path: path, options: .init(durability: .normal)))
            } catch {
                opened = .failure(error)
            }
            semaphore.signal()
        }
        semaphore.wait()
        guard let store = try opened?.get() else { throw CocoaError(.fileReadUnknown) }
        var handle: OpaquePointer?
        guard sqlite3_open(path, &handle) == SQLITE_OK, let handle else { throw CocoaError(.fileReadUnknown) }
        sqlite3_busy_timeout(handle, 5000)
        raw = handle
        engine = HopEngine(store: store, logger: Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() }))
        engine.register(
            Flow("startup", version: "1") { flow in
                try await flow.hop(to: "splash", timeout: .seconds(5))
                if try await flow.isFirstUse("onboarding") {
                    try await flow.hop(to: "onboarding")
                    try await flow.markUsed("onboarding")
                }
                if try await flow.session() == nil { try await flow.hop(to: "login") }
                try await flow.sleep(for: .milliseconds(1))
                if let output = try await flow.hop(to: "main").json { _ = try? StepOutput(json: output).decode([String: Int].self) }
            })
        engine.register(step: "splash") { _ in }
        engine.register(step: "onboarding", .external)
        engine.register(step: "login", .external(unhopWhen: .sessionStored))
        engine.register(step: "main") { step in try await step.unhop(output: ["ok": 1]) }
    }

    func exec(_ sql: String) { sqlite3_exec(raw, sql, nil, nil, nil) }

    func insert(seq: Int, kind: String, step: String?, token: String?, value: String?) {
        var statement: OpaquePointer?
        sqlite3_prepare_v2(raw, "INSERT INTO history (run_id, seq, kind, step, token, value, at) VALUES (1, ?1, ?2, ?3, ?4, ?5, 0)", -1, &statement, nil)
        defer { sqlite3_finalize(statement) }
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        sqlite3_bind_int64(statement, 1, Int64(seq))
        sqlite3_bind_text(statement, 2, kind, -1, transient)
        for (position, text) in [(Int32(3), step), (4, token), (5, value)] {
            if let text { sqlite3_bind_text(statement, position, text, -1, transient) } else { sqlite3_bind_null(statement, position) }
        }
        sqlite3_step(statement)
    }

    func run(_ bytes: [UInt8]) {
        var input = Input(bytes: bytes)
        exec("DELETE FROM history; DELETE FROM runs; DELETE FROM sessions; DELETE FROM first_use;")
        exec("INSERT INTO runs (id, flow, subject, flow_version, status, created_at, updated_at) VALUES (1, 'startup', 'default', '1', 'running', 0, 0)")
        var seq = 0
        while let selector = input.byte() {
            seq += 1
            let kind = kinds[Int(selector) % kinds.count]
            let step = selector & 0x80 == 0 ? steps[Int(input.byte() ?? 0) % steps.count] : input.text(maxLength: 12)
            let token = (input.byte() ?? 0) % 3 == 0 ? nil : "t\((input.byte() ?? 0) % 4)"
            let value = (input.byte() ?? 0) % 2 == 0 ? nil : input.text(maxLength: 40)
            if let value { _ = try? JSONText.validate(value, as: "value") }
            insert(seq: seq, kind: kind, step: step, token: token, value: value)
        }
        let semaphore = DispatchSemaphore(value: 0)
        Task { [engine] in
            _ = try? await engine.resumeAll()
            // A stored timer or deadline may lie far ahead: wait for the run to settle, at most 2 s.
            await withTaskGroup(of: Void.self) { group in
                group.addTask { _ = try? await engine.settled(runID: 1) }
                group.addTask { try? await Task.sleep(for: .seconds(2)) }
                await group.next()
                group.cancelAll()
            }
            await engine.stopExecuting()
            semaphore.signal()
        }
        semaphore.wait()
    }
}

nonisolated(unsafe) private var harness: Harness?

private func fuzzHistory(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    if harness == nil { harness = try? Harness() }
    harness?.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}

/// The executable's entry point (SwiftPM names it after the module): hands over to libFuzzer.
@_cdecl("hop_fuzz_history_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, fuzzHistory)
}
