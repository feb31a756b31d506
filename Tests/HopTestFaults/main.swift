// A helper process for the reliability tests: runs the start-up flow (every step finishing at
// once) through the fault-injection VFS, printing each history entry once its commit returned.
//
//   hop-test-faults --db PATH [--power-loss-at N | --power-loss-at-write N] [--normal]
//
// With --power-loss-at, the power is "cut" at the Nth sync (with --power-loss-at-write, just
// before the Nth write): writes not yet synced are dropped and the process exits 86. Prints `ack SEQ KIND STEP` per acknowledged entry, then `completed`.
import CHopFaultVFS
import Foundation
import HopEngine
import HopStore
import HopTestSupport
import Logging

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))  // unbuffered: lines survive _exit
}

var arguments = CommandLine.arguments.dropFirst()
var database: String?
var powerLossAt = 0
var powerLossAtWrite = 0
var durability = HopStore.Durability.full
while let argument = arguments.popFirst() {
    switch argument {
    case "--db": database = arguments.popFirst()
    case "--power-loss-at": powerLossAt = arguments.popFirst().flatMap { Int($0) } ?? 0
    case "--power-loss-at-write": powerLossAtWrite = arguments.popFirst().flatMap { Int($0) } ?? 0
    case "--normal": durability = .normal
    default:
        FileHandle.standardError.write(Data("hop-test-faults: unknown argument \(argument)\n".utf8))
        exit(64)
    }
}
guard let database else {
    FileHandle.standardError.write(Data("hop-test-faults: --db PATH is required\n".utf8))
    exit(64)
}
guard hop_fault_vfs_register() == 0 else { exit(70) }
if powerLossAtWrite > 0 {
    hop_fault_vfs_power_loss_at_write(powerLossAtWrite)
} else {
    hop_fault_vfs_power_loss_at(powerLossAt)
}

let logger = Logger(label: "hop-test-faults", factory: { _ in SwiftLogNoOpLogHandler() })
do {
    var options = HopStore.Options(durability: durability)
    options.vfs = "hopfault"
    let store = try await HopStore.open(path: database, options: options)
    let engine = HopEngine(
        store: store, logger: logger,
        configuration: .init(
            observer: { event in
                if case .recorded(_, let entry) = event {
                    say("ack \(entry.seq) \(entry.kind.rawValue) \(entry.step ?? "-")")
                }
            },
            engineID: "hop-test-faults"))  // a label: a restarted helper takes its runs back at once by liveness
    registerInstantStartup(on: engine)
    let run = try await engine.start("startup")
    let settled = try await engine.settled(runID: run.id)
    say(settled?.status.rawValue ?? "missing")
    // End here, as a daemon killed after its work: the store is not closed, so a power cut
    // never happens inside its deinitializer (ThreadSanitizer reports a thread ended there).
    exit(0)
} catch {
    FileHandle.standardError.write(Data("hop-test-faults: \(error)\n".utf8))
    exit(1)
}
