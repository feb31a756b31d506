import Foundation
import HopStore

// Test helper: opens a Hop database in its own process, as a daemon or hopctl would.
// Usage: hop-test-store migrate PATH    prints the schema version
//        hop-test-store modes PATH      writes once, then prints the permission bits of the file, its -wal and -shm
// HOP_TEST_UMASK=<octal> sets the process's umask first.

if let mask = ProcessInfo.processInfo.environment["HOP_TEST_UMASK"], let value = mode_t(mask, radix: 8) {
    umask(value)
}
let arguments = CommandLine.arguments
guard arguments.count == 3, ["migrate", "modes"].contains(arguments[1]) else {
    FileHandle.standardError.write(Data("usage: hop-test-store migrate|modes PATH\n".utf8))
    exit(64)
}
do {
    let path = arguments[2]
    let store = try await HopStore.open(path: path)
    if arguments[1] == "migrate" {
        print("schema \(store.schemaVersion)")
    } else {
        try await store.setFact(subject: "default", key: "written", value: "yes")
        for file in [path, path + "-wal", path + "-shm"] {
            let mode = (try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int) ?? 0
            print("\(URL(fileURLWithPath: file).lastPathComponent) \(String(mode, radix: 8))")
        }
    }
} catch {
    FileHandle.standardError.write(Data("\(error)\n".utf8))
    exit(1)
}
