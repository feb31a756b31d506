import CHopFaultVFS
import Foundation
import HopEngine
import HopStore
import HopTestSupport

/// The start-up flow's history when nothing goes wrong.
let referencePath = [
    "hop splash", "unhop splash", "decision isFirstUse(onboarding)", "hop onboarding", "unhop onboarding",
    "effect markUsed(onboarding)", "decision session", "hop login", "unhop login", "hop main", "unhop main",
    "complete -",
]

/// A run's history as "kind step" lines: the path the flow took. Takeover entries (which
/// engine executes the run from there on) are left out: every restart adds one.
func historyPath(_ store: HopStore, runID: Int64) async throws -> [String] {
    try await store.history(runID: runID).filter { $0.kind != .takeover }.map {
        "\($0.kind.rawValue) \($0.step ?? "-")"
    }
}

/// Options that open a store through the fault-injection VFS.
func faultOptions() -> HopStore.Options {
    _ = hop_fault_vfs_register()
    var options = HopStore.Options()
    options.vfs = "hopfault"
    return options
}

/// Runs `hopctl` with `arguments` on `database` until it succeeds and returns how many times the
/// write lock stayed taken (the one documented failure under load, retried). Blocks: call it from
/// a thread of the test's own.
@discardableResult
func hopctlRetryingBusy(_ hopctl: String, _ arguments: [String], database: String, scratch: String) throws -> Int {
    var busy = 0
    while true {
        let result = try spawnAndWait(hopctl, arguments + ["--db", database], scratch: scratch)
        if result.status == 0 { return busy }
        guard result.status == 1 && result.stderr.contains("busy") else {
            throw TestFailure("hopctl \(arguments): exit \(result.status): \(result.stderr)")
        }
        busy += 1
    }
}
