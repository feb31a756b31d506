import CHopFaultVFS
import Foundation
import HopEngine
import HopStore

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
