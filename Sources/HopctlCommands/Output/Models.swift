import HopStore

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

// The JSON that hopctl prints with --json. Field names are part of hopctl's contract (README, "hopctl --json").

struct RunJSON: Encodable {
    var run: Int64
    var flow: String
    var subject: String
    var status: String
    @ExplicitNull var currentStep: String?
    /// The history entry that entered `currentStep` (what `hopctl unhop --entry` names).
    @ExplicitNull var currentStepEntry: Int64?
    var flowVersion: String
    var createdAt: Date
    var updatedAt: Date
    @ExplicitNull var owner: String?
    var leaseLive: Bool
    /// For a diverged run, where and why (`hopctl status`); `null` otherwise.
    @ExplicitNull var diverged: DivergenceJSON?

    /// `run` as listed, its lease judged at `now` (the database's clock: ``HopStorage/now()``);
    /// `stepEntry` is the entry that entered its step in flight.
    init(_ run: RunRecord, stepEntry: Int64?, divergence: String? = nil, now: Date) {
        diverged = divergence.map(DivergenceJSON.init(message:))
        currentStepEntry = run.currentStep == nil ? nil : stepEntry
        self.run = run.id
        flow = run.flow
        subject = run.subject
        status = run.status.rawValue
        currentStep = run.currentStep
        flowVersion = run.flowVersion
        createdAt = run.createdAt
        updatedAt = run.updatedAt
        owner = run.ownerLabel
        leaseLive = run.leaseIsLive(at: now)
    }

    enum CodingKeys: String, CodingKey {
        case run, flow, subject, status
        case currentStep = "current_step"
        case currentStepEntry = "current_step_entry"
        case flowVersion = "flow_version"
        case createdAt = "created_at"
        case updatedAt = "updated_at"
        case owner
        case leaseLive = "lease_live"
        case diverged
    }
}

extension RunJSON {
    /// `runs` as listed, each with the entry of its step in flight (one read for them all).
    static func list(
        _ runs: [RunRecord], in store: any HopAdministration, divergences: [Int64: String] = [:]
    ) async throws -> [RunJSON] {
        let entries = try await store.stepEntries(runIDs: runs.filter { $0.currentStep != nil }.map(\.id))
        let now = store.now()
        return runs.map { RunJSON($0, stepEntry: entries[$0.id], divergence: divergences[$0.id], now: now) }
    }
}

extension RunRecord {
    /// The entry among `entries` (the run's history) that entered its step in flight.
    func stepEntry(in entries: [HistoryEntry]) -> Int64? {
        guard let token = currentToken else { return nil }
        return entries.last { $0.kind == .hop && $0.token == token }?.seq
    }
}

struct HistoryJSON: Encodable {
    var run: RunJSON
    var entries: [Entry]

    /// One entry; `value` is the stored JSON itself (an output, a decision, a deadline), or a
    /// JSON string for a plain-text message (an error, a cancellation).
    struct Entry: Encodable {
        var seq: Int64
        var kind: String
        @ExplicitNull var step: String?
        @ExplicitNull var value: JSONValue?
        var at: Date

        init(_ event: HistoryEntry) {
            seq = event.seq
            kind = event.kind.rawValue
            step = event.step
            value = event.value.map(JSONValue.init(stored:))
            at = event.at
        }

        enum CodingKeys: String, CodingKey { case seq, kind, step, value, at }
    }
}

struct SessionJSON: Encodable {
    var subject: String
    var userID: String
    var token: String
    var tokenRedacted: Bool
    var createdAt: Date
    @ExplicitNull var expiresAt: Date?

    enum CodingKeys: String, CodingKey {
        case subject
        case userID = "user_id"
        case token
        case tokenRedacted = "token_redacted"
        case createdAt = "created_at"
        case expiresAt = "expires_at"
    }
}

struct FirstUseJSON: Encodable {
    var subject: String
    var feature: String
    var usedAt: Date

    enum CodingKeys: String, CodingKey {
        case subject, feature
        case usedAt = "used_at"
    }
}

struct EdgeJSON: Encodable {
    @ExplicitNull var from: String?
    var to: String
    var count: Int

    enum CodingKeys: String, CodingKey { case from, to, count }
}

struct PatchJSON: Encodable {
    var patch: String
    var runs: Int
    var firstRecordedAt: Date
    var unfinishedWithout: Int

    enum CodingKeys: String, CodingKey {
        case patch, runs
        case firstRecordedAt = "first_recorded_at"
        case unfinishedWithout = "unfinished_without"
    }
}

/// Where a diverged run stopped agreeing with the flow code, read from its `diverge` entry.
struct DivergenceJSON: Encodable {
    /// The history entry where the code asked for something else.
    var entry: Int64?
    /// The version of the code that replayed the run.
    var codeVersion: String?
    /// The version the run started with.
    var runVersion: String?
    var message: String

    enum CodingKeys: String, CodingKey {
        case entry, message
        case codeVersion = "code_version"
        case runVersion = "run_version"
    }

    /// Reads the parts of a divergence message (the engine's `Replay.diverged` writes it).
    init(message: String) {
        self.message = message
        entry = message.firstMatch(of: /\(history entry (\d+)\)/).flatMap { Int64($0.1) }
        if let versions = message.firstMatch(of: /\(version ([^;]+); the run started with version ([^)]+)\)/) {
            codeVersion = String(versions.1)
            runVersion = String(versions.2)
        }
    }
}

struct ForkJSON: Encodable {
    var old: RunJSON
    var new: RunJSON
    var through: Int64
}

/// An optional field written as `null` when it has no value: the fields of hopctl's JSON are the
/// same in every object (a synthesized `Encodable` would leave a `nil` field out).
@propertyWrapper
struct ExplicitNull<Value: Encodable>: Encodable {
    var wrappedValue: Value?

    init(wrappedValue: Value?) { self.wrappedValue = wrappedValue }

    func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        if let wrappedValue { try container.encode(wrappedValue) } else { try container.encodeNil() }
    }
}
