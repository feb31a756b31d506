#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A patch of a flow's code as the runs' histories show it (`hopctl patches`).
public struct PatchUsage: Sendable, Equatable, Codable {
    /// The patch's name, as `flow.patched(name)` gives it.
    public var name: String
    /// When a run first took its new branch.
    public var firstRecordedAt: Date
    /// How many runs took its new branch.
    public var runs: Int
}

extension PatchUsage {
    /// A patch's use as counted by a database.
    package static func counted(name: String, firstRecordedAt: Date, runs: Int) -> PatchUsage {
        PatchUsage(name: name, firstRecordedAt: firstRecordedAt, runs: runs)
    }
}
