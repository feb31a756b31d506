import Foundation
import PackagePlugin

/// Compiles the numbered SQL files of `Migrations/` (SQLite's, for HopStore) or of
/// `Migrations/<dialect>/` (for a backend's target: `Migrations/postgres/` for HopPostgres) into
/// the target that uses this plugin, so that a binary copied to another machine still carries its
/// whole schema.
@main
struct EmbedMigrations: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) async throws -> [Command] {
        // A backend's target: its dialect's folder, and `Migration.<dialect>Embedded` beside HopStore's own.
        let dialects = ["HopPostgres": "postgres"]
        var migrations = context.package.directoryURL.appending(path: "Migrations")
        var options: [String] = []
        if let dialect = dialects[target.name] {
            migrations = migrations.appending(path: dialect)
            options = ["--import", "HopStore", "--name", "\(dialect)Embedded"]
        }
        let files = try FileManager.default
            .contentsOfDirectory(at: migrations, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "sql" }
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedMigrations.swift")
        // The folder is an input too, and the tool lists its files when it runs: a build planned
        // before a migration was added still embeds it (the folder's time changes with its list;
        // the plugin's own list is only as new as the build plan).
        return [
            .buildCommand(
                displayName: "Embedding the migrations into \(target.name)",
                executable: try context.tool(named: "hop-embed-migrations").url,
                arguments: [output.path] + options + [migrations.path],
                inputFiles: [migrations] + files,
                outputFiles: [output]
            )
        ]
    }
}
