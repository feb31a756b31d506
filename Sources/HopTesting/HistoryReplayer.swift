import Foundation
import HopEngine

/// Replays recorded runs against flow code in a test, before that code is deployed: no database,
/// no step runs. A run the code could not carry on is reported with the history entry where the
/// code asks for something else, in the words a divergence at run time would use.
///
/// ```swift
/// // hopctl history --flow startup --all-runs --json > Tests/Fixtures/startup-histories.json
/// let recorded = try Data(contentsOf: fixture)
/// let reports = try await HistoryReplayer.replay(startupFlow, againstJSON: recorded)
/// #expect(reports.allSatisfy(\.isCompatible), "\(reports.filter { !$0.isCompatible })")
/// ```
///
/// Every run of the flow's name is replayed, whatever version recorded it: at run time, a run
/// continues on the version it started with, so replay the runs of the version whose code you
/// changed (``ReplayReport/recordedVersion`` says which).
public enum HistoryReplayer {
    /// Replays each run of `runs` recorded by a flow of `flow`'s name against `flow`'s code.
    public static func replay(_ flow: Flow, against runs: [RecordedRun]) async -> [ReplayReport] {
        var reports: [ReplayReport] = []
        for recorded in runs where recorded.flow == flow.name {
            let run = RunRecord(
                id: recorded.runID, flow: recorded.flow, subject: recorded.subject, flowVersion: recorded.version,
                status: recorded.status)
            let verdict: ReplayReport.Verdict
            switch await DryReplay.replay(flow, run: run, history: recorded.entries) {
            case .compatible: verdict = .compatible
            case .diverged(let entry, let message): verdict = .diverged(entry: entry, message: message)
            case .failed(let message): verdict = .failed(message: message)
            }
            reports.append(
                ReplayReport(
                    runID: recorded.runID, flow: recorded.flow, subject: recorded.subject,
                    recordedVersion: recorded.version, codeVersion: flow.version, verdict: verdict))
        }
        return reports
    }

    /// Replays the runs in `json` (what `hopctl history --json` or `hopctl history --all-runs --json`
    /// printed) against `flow`'s code.
    public static func replay(_ flow: Flow, againstJSON json: Data) async throws -> [ReplayReport] {
        await replay(flow, against: try RecordedRun.parse(json))
    }
}

/// The result of replaying one recorded run against flow code.
public struct ReplayReport: Sendable, Equatable, CustomStringConvertible {
    /// What the replay found.
    public enum Verdict: Sendable, Equatable {
        /// The code asks for what the run recorded, as far as its history goes.
        case compatible
        /// The code asks for something else at history entry `entry` (`nil`: where the history ends).
        case diverged(entry: Int64?, message: String)
        /// The flow body threw something else (e.g. a recorded decision no longer decodes).
        case failed(message: String)
    }

    public let runID: Int64
    public let flow: String
    public let subject: String
    /// The version the run was recorded with.
    public let recordedVersion: String
    /// The version of the code replayed against it.
    public let codeVersion: String
    public let verdict: Verdict

    /// Whether the code can carry the run on.
    public var isCompatible: Bool { verdict == .compatible }

    public var description: String {
        let run = "run \(runID) of \(flow) for \(subject) (recorded on version \(recordedVersion))"
        switch verdict {
        case .compatible: return "\(run): compatible with version \(codeVersion)"
        case .diverged(_, let message): return "\(run): \(message)"
        case .failed(let message): return "\(run): the flow body failed: \(message)"
        }
    }
}

/// One recorded run: its identity and its history entries, as `hopctl history --json` prints them.
public struct RecordedRun: Sendable, Equatable {
    public var runID: Int64
    public var flow: String
    public var subject: String
    public var version: String
    public var status: RunStatus
    public var entries: [HistoryEntry]

    public init(
        runID: Int64, flow: String, subject: String, version: String, status: RunStatus, entries: [HistoryEntry]
    ) {
        self.runID = runID
        self.flow = flow
        self.subject = subject
        self.version = version
        self.status = status
        self.entries = entries
    }

    /// Reads what `hopctl history --json` printed (one run) or `hopctl history --all-runs --json`
    /// (an array of runs).
    /// - Throws: ``HopError`` with code `.invalidInput`, naming what is missing where.
    public static func parse(_ json: Data) throws -> [RecordedRun] {
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: json, options: [.fragmentsAllowed])
        } catch {
            throw HopError(.invalidInput, "the recorded histories are not JSON: \(error.localizedDescription)")
        }
        let items: [Any] = (object as? [Any]) ?? [object]
        return try items.enumerated().map { index, item in try RecordedRun(item, at: index) }
    }

    private init(_ item: Any, at index: Int) throws {
        func refuse(_ what: String) -> HopError {
            HopError(
                .invalidInput, "recorded run \(index + 1): \(what)",
                hint:
                    "Give the output of `hopctl history --flow F --json` or `hopctl history --flow F --all-runs --json`"
            )
        }
        guard let object = item as? [String: Any], let run = object["run"] as? [String: Any],
            let entries = object["entries"] as? [[String: Any]]
        else { throw refuse("expected an object with \"run\" and \"entries\"") }
        guard let id = (run["run"] as? NSNumber)?.int64Value, let flow = run["flow"] as? String,
            let subject = run["subject"] as? String, let version = run["flow_version"] as? String,
            let status = (run["status"] as? String).flatMap(RunStatus.init(rawValue:))
        else { throw refuse("its \"run\" lacks run, flow, subject, flow_version or status") }
        self.runID = id
        self.flow = flow
        self.subject = subject
        self.version = version
        self.status = status
        self.entries = try entries.map { entry in
            guard let seq = (entry["seq"] as? NSNumber)?.int64Value,
                let kind = (entry["kind"] as? String).flatMap(HistoryKind.init(rawValue:))
            else { throw refuse("an entry lacks seq or kind, or its kind is unknown") }
            return HistoryEntry.recorded(
                runID: id, seq: seq, kind: kind, step: entry["step"] as? String,
                value: try Self.storedText(entry["value"]))
        }
    }

    /// The stored text of an entry's value: hopctl prints stored JSON as JSON itself.
    private static func storedText(_ value: Any?) throws -> String? {
        guard let value, !(value is NSNull) else { return nil }
        let data = try JSONSerialization.data(withJSONObject: value, options: [.fragmentsAllowed, .sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }
}
