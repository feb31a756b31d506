#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The database an engine runs on, whichever backend holds it: one SQLite file (``HopStore``)
/// or a server shared by a fleet (`HopPostgres`'s `PostgresStore`).
///
/// A daemon that chooses its database by URL opens it with `HopDatabase.open(url:)` (in
/// `HopPostgres`) and gives it to `HopEngine(database:logger:configuration:)`; its flow code is
/// the same on either backend.
public struct HopDatabase: Sendable {
    /// The backend, behind the storage seam.
    package let storage: any HopAdministration

    package init(_ storage: any HopAdministration) { self.storage = storage }

    /// Where the data lives, for logs and messages: a file path, or a URL without its password.
    public var location: String { storage.location }

    // MARK: Reading what the flows did (the same on either backend)

    /// The run with `id`, if it exists.
    public func run(id: Int64) async throws -> RunRecord? { try await storage.run(id: id) }

    /// The newest run of `flow` for `subject`, finished or not.
    public func latestRun(flow: String, subject: String = "default") async throws -> RunRecord? {
        try await storage.latestRun(flow: flow, subject: subject)
    }

    /// Every run of `flow`, for every subject, oldest first.
    public func allRuns(flow: String) async throws -> [RunRecord] { try await storage.allRuns(flow: flow) }

    /// The history of run `runID` in order; with `limit`, its last `limit` entries.
    public func history(runID: Int64, limit: Int? = nil) async throws -> [HistoryEntry] {
        try await storage.history(runID: runID, limit: limit)
    }

    /// The entries of run `runID` after entry `after` (0: from the first), in order, at most
    /// `limit`: a long history a page at a time, the next page after the last entry of this one
    /// (a run that went round a loop for years holds millions of entries).
    public func history(runID: Int64, after: Int64, limit: Int) async throws -> [HistoryEntry] {
        try await storage.history(runID: runID, after: after, through: .max, limit: limit)
    }

    /// The time by the database's clock: this machine's for a file, the server's (as last
    /// measured) for PostgreSQL. Session expiry and deadlines are judged by it.
    public func now() -> Date { storage.now() }

    /// The stored, unexpired session of `subject`.
    public func session(subject: String = "default") async throws -> StoredSession? {
        try await storage.session(subject: subject)
    }

    /// The features `subject` has used; any other is on its first use.
    public func firstUseFlags(subject: String = "default") async throws -> [FirstUseFlag] {
        try await storage.firstUseFlags(subject: subject)
    }

    /// The daemon's fact `key` about `subject`.
    public func fact(subject: String = "default", key: String) async throws -> String? {
        try await storage.fact(subject: subject, key: key)
    }
}

extension HopStore {
    /// This store as the database of an engine.
    public nonisolated var database: HopDatabase { HopDatabase(self) }
}
