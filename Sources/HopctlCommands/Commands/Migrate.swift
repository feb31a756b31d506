import ArgumentParser
import HopStore

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Create the database, or upgrade its schema; prints the schema version.")

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        let store = try await OpenDatabases.open(global.path, migrate: true) {
            try await HopStore.open(
                path: global.path, options: HopStore.Options(busyTimeout: .milliseconds(global.busyTimeout)))
        }
        Output.line("schema version \(store.schemaVersion) (\(Output.printable(store.location)))")
    }
}
