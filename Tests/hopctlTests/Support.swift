import Foundation
import HopStore
import HopTestSupport
import Testing

/// Runs the built `hopctl` against the database of `folder` (the file there, unless `db` names another).
func hopctl(
    _ arguments: [String], in folder: TemporaryDirectory, db: String? = nil, stdin: String? = nil
) async throws -> (status: Int32, stdout: String, stderr: String) {
    try await run("hopctl", arguments + ["--db", db ?? folder.database], stdin: stdin, in: folder)
}

/// Runs `hopctl` and parses its standard output as JSON.
func hopctlJSON(_ arguments: [String], in folder: TemporaryDirectory, db: String? = nil) async throws -> Any {
    let result = try await hopctl(arguments + ["--json"], in: folder, db: db)
    #expect(result.status == 0, "\(arguments): \(result.stderr)")
    return try JSONSerialization.jsonObject(with: Data(result.stdout.utf8), options: [.fragmentsAllowed])
}

/// Every run of the startup flow in `store`, oldest first, as "id subject status".
func startupRuns(in store: any HopAdministration) async throws -> [String] {
    try await store.allRuns(flow: "startup").map { "\($0.id) \($0.subject) \($0.status.rawValue)" }
}

/// A new database of `backend` where the startup flow ran to the end once (run 1), in a
/// daemon process: its folder, its location for hopctl and the store open on it.
func completedStartup(
    on backend: TestBackend
) async throws -> (folder: TemporaryDirectory, db: String, store: any HopAdministration) {
    let folder = try TemporaryDirectory()
    let db = try await backend.location(folder)
    try await completedStartup(folder, db: db)
    return (folder, db, try await backend.open(folder))
}

/// A database where the startup flow ran to the end once, in a daemon process (all steps in process).
func completedStartup(_ folder: TemporaryDirectory, db: String? = nil) async throws {
    let result = try await run("hop-test-daemon", ["--db", db ?? folder.database], in: folder)
    #expect(result.status == 0 && result.stdout.contains("settled completed"), "\(result.stdout)\(result.stderr)")
}
