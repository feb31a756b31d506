import HopEngine

/// A storage backend the engine's tests run against: the engine suite is parameterised over
/// ``all``, so every backend passes the same tests (`@Test(arguments: TestBackend.all)`).
package struct TestBackend: Sendable, CustomStringConvertible {
    /// The backend's name, shown in test names.
    package let name: String
    /// Opens a fresh storage whose data lives in `folder` (or, for a server, in a database made for it).
    package let open: @Sendable (_ folder: TemporaryDirectory) async throws -> any HopStorage

    package var description: String { name }

    /// One SQLite file (`HopStore`).
    package static let sqlite = TestBackend(name: "sqlite") { folder in try await HopStore.open(path: folder.database) }

    /// Every backend the engine's tests run against. A new backend adds itself here.
    package static let all: [TestBackend] = [.sqlite]
}
