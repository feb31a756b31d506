import ArgumentParser
import Foundation
import HopStore

/// Options every command takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The Hop database.", valueName: "path"))
    var db: String?

    @Option(name: .long, help: ArgumentHelp("How long a write waits for a daemon's write lock, in milliseconds.", valueName: "ms"))
    var busyTimeout: Int = 5000

    var path: String { db ?? DatabaseLocation.defaultPath() }

    func validate() throws {
        guard busyTimeout >= 0 else { throw ValidationError("--busy-timeout must be 0 or more milliseconds") }
    }

    /// Opens the database for reading: never creates or upgrades it.
    func openForReading() async throws -> HopStore {
        try await HopStore.open(
            path: path, options: HopStore.Options(busyTimeout: .milliseconds(busyTimeout), createIfMissing: false, migrate: false))
    }

    /// Opens the database for a change: it must exist; its schema is brought up to date.
    func openForWriting() async throws -> HopStore {
        try await HopStore.open(
            path: path, options: HopStore.Options(busyTimeout: .milliseconds(busyTimeout), createIfMissing: false, migrate: true))
    }
}

/// The subject option, `default` unless given.
struct SubjectOption: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Whom the run is for (a device, a user).", valueName: "subject"))
    var subject: String = "default"

    func validate() throws { try checkIdentifier(subject, as: "subject") }
}

/// `--json` for read commands.
struct OutputOptions: ParsableArguments {
    @Flag(name: .long, help: "Print JSON (stable field names, documented in the README) instead of a table.")
    var json = false
}

/// Turns an identifier the store would refuse into a usage error (exit 64) before anything is opened.
func checkIdentifier(_ value: String, as what: String) throws {
    do {
        try Identifier.validate(value, as: what)
    } catch let error as HopStoreError {
        throw ValidationError("\(error.reason). \(error.hint ?? "")")
    }
}
