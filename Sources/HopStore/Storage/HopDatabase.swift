/// The database an engine runs on, whichever backend holds it: one SQLite file (``HopStore``)
/// or a server shared by a fleet (`HopPostgres`'s `PostgresStore`).
///
/// A daemon that chooses its database by URL opens it with `HopDatabase.open(url:)` (in
/// `HopPostgres`) and gives it to `HopEngine(database:logger:configuration:)`; its flow code is
/// the same on either backend.
public struct HopDatabase: Sendable {
    /// The backend, behind the storage seam.
    package let storage: any HopStorage

    package init(_ storage: any HopStorage) { self.storage = storage }

    /// Where the data lives, for logs and messages: a file path, or a URL without its password.
    public var location: String { storage.location }
}

extension HopStore {
    /// This store as the database of an engine.
    public nonisolated var database: HopDatabase { HopDatabase(self) }
}
