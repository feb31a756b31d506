import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging

/// The step bodies `hop-test-daemon` noted in `folder` so far, one "<run id> <step>" a line
/// (its `PATH.bodies`, or `--files` prefix); none before the first.
func bodyLines(in folder: TemporaryDirectory) -> [String] {
    ((try? String(contentsOfFile: folder.database + ".bodies", encoding: .utf8)) ?? "").split(separator: "\n")
        .map(String.init)
}

/// An engine over a fresh database (or over `storage`) with the startup flow; onboarding and
/// login are external.
func startupEngine(
    _ folder: TemporaryDirectory, backend: TestBackend = .sqlite,
    logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), flow: Flow = startupFlow(),
    storage: (any HopStorage)? = nil, configuration: HopEngine.Configuration = HopEngine.Configuration()
) async throws -> HopEngine {
    var opened: any HopStorage
    if let storage { opened = storage } else { opened = try await backend.open(folder) }
    let engine = HopEngine(storage: opened, logger: logger, configuration: configuration)
    engine.register(flow)
    engine.register(step: "splash") { _ in }
    engine.register(step: "onboarding", .external)
    engine.register(step: "login", .external(unhopWhen: .sessionStored))
    engine.register(step: "main") { _ in }
    return engine
}

/// The replayed entries of a run's history as "kind step" lines.
func path(of runID: Int64, in store: any HopStorage) async throws -> [String] {
    try await store.history(runID: runID).filter { $0.kind.isReplayed }.map { "\($0.kind.rawValue) \($0.step ?? "")" }
}
