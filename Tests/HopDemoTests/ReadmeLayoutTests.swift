import Foundation
import Testing

/// The README's Layout section is the map a newcomer reads before the tree: every path it names
/// exists, and every folder of `Sources/` is on it.
@Suite struct ReadmeLayoutTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func layoutSection() throws -> String {
        let readme = try String(contentsOf: packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let start = try #require(readme.range(of: "\n## Layout\n"), "README lacks its Layout section")
        let end = readme.range(of: "\n## ", range: start.upperBound..<readme.endIndex)?.lowerBound ?? readme.endIndex
        return String(readme[start.upperBound..<end])
    }

    @Test func everyPathTheLayoutNamesExists() throws {
        let section = try Self.layoutSection()
        let paths = try Regex(#"`((?:Sources|Tests|Examples|Benchmarks|Migrations|Plugins|Fuzz|script)[^`\s]*)`"#)
        var checked = 0
        for match in section.matches(of: paths) {
            let path = String(section[match.range]).trimmingCharacters(in: CharacterSet(charactersIn: "`"))
            #expect(
                FileManager.default.fileExists(atPath: Self.packageRoot.appendingPathComponent(path).path),
                "the README's Layout names \(path), which is not in the tree")
            checked += 1
        }
        #expect(checked > 20, "the Layout section names only \(checked) paths")
    }

    @Test func everySourceFolderIsOnTheLayout() throws {
        let section = try Self.layoutSection()
        let sources = Self.packageRoot.appendingPathComponent("Sources")
        for module in try FileManager.default.contentsOfDirectory(atPath: sources.path) {
            let folders = try FileManager.default.contentsOfDirectory(
                atPath: sources.appendingPathComponent(module).path
            )
            .filter { !$0.hasSuffix(".swift") && !$0.hasSuffix(".h") && $0 != "module.modulemap" }
            if folders.isEmpty {
                #expect(section.contains("`Sources/\(module)"), "Sources/\(module) is missing from the README's Layout")
            }
            for folder in folders {
                #expect(
                    section.contains("`Sources/\(module)/\(folder)`") || section.contains("`Sources/\(module)`"),
                    "Sources/\(module)/\(folder) is missing from the README's Layout")
            }
        }
    }
}
