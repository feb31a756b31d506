import Foundation
import HopEngine

/// Prints what the daemon does, one line per hop, with the decision that led there and the time since start.
final class Narrator: Sendable {
    private let started = ContinuousClock.now
    private let hopctl: String

    init(database: String, defaultDatabase: Bool) {
        hopctl = defaultDatabase ? "hopctl" : "hopctl --db \(database)"
    }

    private var elapsed: String {
        let duration = ContinuousClock.now - started
        let seconds = Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
        return String(format: "%6.2fs", seconds)
    }

    func say(_ text: String) {
        write("[\(elapsed)] \(text)\n")
    }

    func note(_ text: String) {
        write("          \(text)\n")
    }

    /// Writes `line` to standard output; a line that cannot be written (the output closed: a
    /// journal restarted, a pipe's reader gone) is dropped, and the daemon goes on without it.
    /// (`FileHandle.write(_:)` stops the process on such an error.)
    private func write(_ line: String) {
        try? FileHandle.standardOutput.write(contentsOf: Data(line.utf8))
    }

    /// A committed history entry, as a line for people.
    func recorded(_ event: HistoryEntry, subject: String) {
        let step = event.step ?? ""
        switch event.kind {
        case .hop: say("hop    -> \(step)")
        case .unhop: say("unhop  <- \(step)")
        case .decision where step == "session":
            let user = event.value.flatMap { try? JSONDecoder().decode(SessionInfo.self, from: Data($0.utf8)) }.map(
                \.userID)
            say("stored session: \(user ?? "none")")
        case .decision where step.hasPrefix("isFirstUse("):
            let feature = step.dropFirst("isFirstUse(".count).dropLast()
            say("first use of \(feature): \(event.value == "true" ? "yes" : "no")")
        case .effect: say("recorded \(step)")
        case .complete: say("run \(event.runID) completed")
        case .takeover: break  // which engine executes the run: `hopctl history` shows it
        default: say("\(event.kind.rawValue) \(step)")
        }
    }

    /// What to type to finish a parked step.
    func waiting(on step: String, subject: String) {
        let subjectFlag = subject == "default" ? "" : " --subject \(subject)"
        switch step {
        case "login": note("waiting for a login: run `\(hopctl) session login alice\(subjectFlag)`")
        default:
            note("waiting for \(step) to finish: run `\(hopctl) unhop --flow startup --step \(step)\(subjectFlag)`")
        }
    }
}
