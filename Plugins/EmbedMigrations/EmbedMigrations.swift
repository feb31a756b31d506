import Foundation
import PackagePlugin

/// Compiles the numbered SQL files of `Migrations/` into the target that uses this plugin,
/// so that a binary copied to another machine still carries its whole schema.
@main
struct EmbedMigrations: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) async throws -> [Command] {
        let migrations = context.package.directoryURL.appending(path: "Migrations")
        let files = try FileManager.default
            .contentsOfDirectory(at: migrations, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "sql" }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedMigrations.swift")
        return [
            .buildCommand(
                displayName: "Embedding \(files.count) migrations into \(target.name)",
                executable: try context.tool(named: "hop-embed-migrations").url,
                arguments: [output.path] + files.map(\.path),
                inputFiles: files,
                outputFiles: [output]
            )
        ]
    }
}
