import Foundation

/// Where replay decides: walks a run's recorded history while its flow body runs again, and
/// says for each call of the body whether the history already holds it (return what it
/// recorded), whether the history is used up (do the work and record it), or whether the code
/// asks for something else than the history recorded (the run diverged).
///
/// One matcher, ``consume(_:_:)``, serves every replayed call (hops, their ends, timers,
/// decisions, effects); the divergence error is made in one place, ``diverged(asked:)``.
struct Replay {
    /// Which run is replayed, for the divergence message.
    struct Subject {
        var runID: Int64
        var flow: String
        var subject: String
        /// The version the run started with.
        var startedVersion: String
        /// The version of the flow code replaying it.
        var codeVersion: String
    }

    /// What the history holds for a hop the body asks for.
    enum Hop {
        /// The hop and its end: the step is not entered again; the body gets the recorded output.
        case ended(StepOutput)
        /// The hop only: the step was in flight when the run stopped; it is entered again.
        /// `byTheWallClock`: ``HistoryEntry/deadlineGoesByTheWallClock``.
        case inFlight(token: String, deadline: Date?, byTheWallClock: Bool)
        /// Nothing: the history is used up, this is a new hop.
        case new
    }

    let subject: Subject
    /// The entries replay matches (``HistoryKind/isReplayed``); let go once all are matched.
    private var history: [HistoryEntry]
    private var position = 0
    /// The step the run last entered (the `from` of the next transition).
    var lastStep: String?
    /// Why the run's execution stopped (parked, finished elsewhere); every later call throws it.
    private var stopped: (any Error)?

    init(subject: Subject, history: [HistoryEntry]) {
        self.subject = subject
        self.history = history.allSatisfy(\.kind.isReplayed) ? history : history.filter(\.kind.isReplayed)
    }

    /// Whether entries remain to be replayed.
    var isReplaying: Bool { position < history.count }

    /// The sequence number of the next entry to replay, the one a divergence is found at.
    var nextSeq: Int64? { position < history.count ? history[position].seq : nil }

    /// Matches the body's next call, of `kind` named `name`, against the history: the recorded
    /// entry when the history holds it, `nil` when the history is used up (a new call).
    /// - Throws: why the execution stopped, or the divergence when the history recorded another call.
    mutating func consume(_ kind: HistoryKind, _ name: String) throws -> HistoryEntry? {
        if let stopped { throw stopped }
        skipPatchMarkers(except: nil)
        guard position < history.count else { return nil }
        let entry = history[position]
        guard entry.kind == kind, entry.step == name else {
            throw diverged(asked: kind == .hop ? "hop to '\(name)'" : "\(kind.rawValue) '\(name)'")
        }
        advance()
        return entry
    }

    /// Matches a hop to `step`, and the end of that hop when the history holds it.
    mutating func consumeHop(to step: String) throws -> Hop {
        guard let hop = try consume(.hop, step) else { return .new }
        lastStep = step
        guard position < history.count, history[position].kind.endsStep else {
            return .inFlight(
                token: hop.token ?? "", deadline: hop.deadline, byTheWallClock: hop.deadlineGoesByTheWallClock)
        }
        let end = history[position]
        guard end.token == hop.token else { throw diverged(asked: "the end of '\(step)'") }
        advance()
        return .ended(Self.output(of: end))
    }

    /// Which branch of patch `name` the body takes: `true` (the new one) where the history holds
    /// the patch's marker, `false` (the old one) where the history goes on without it — it was
    /// recorded before the patch existed —, and `nil` past the end of the history: a new decision,
    /// the new branch, whose marker the caller records.
    mutating func consumePatch(_ name: String) throws -> Bool? {
        if let stopped { throw stopped }
        skipPatchMarkers(except: name)
        guard position < history.count else { return nil }
        guard history[position].kind == .patch else { return false }
        advance()
        return true
    }

    /// The body returned: history it no longer reaches is a divergence too.
    mutating func finish() throws {
        if let stopped { throw stopped }
        skipPatchMarkers(except: nil)
        if isReplaying { throw diverged(asked: "the end of the flow") }
    }

    /// Moves past the markers of patches the code no longer asks about (but `name`'s): deleting a
    /// `patched` call, once no unfinished run needs its old branch, is how a patch is retired,
    /// and the markers it left in histories must not stop those runs.
    private mutating func skipPatchMarkers(except name: String?) {
        while position < history.count, history[position].kind == .patch, history[position].step != name {
            advance()
        }
    }

    /// Throws why the execution stopped, if it did.
    func throwIfStopped() throws {
        if let stopped { throw stopped }
    }

    /// Stops the execution: every later call of the body throws `error` (the first one given).
    mutating func stop(_ error: any Error) {
        if stopped == nil { stopped = error }
    }

    /// Moves past the matched entry; once the whole history is matched, lets it go (a run may
    /// then wait in a step for a long time, and thousands may).
    private mutating func advance() {
        position += 1
        if position >= history.count {
            history = []
            position = 0
        }
    }

    /// The divergence of the body's call `asked` from the history's next entry.
    func diverged(asked: String) -> HopError {
        let recorded =
            position < history.count
            ? "\(history[position].kind.rawValue) '\(history[position].step ?? "")' (history entry \(history[position].seq))"
            : "nothing more"
        return HopError(
            .diverged,
            "run \(subject.runID) of flow '\(subject.flow)' for subject '\(subject.subject)' diverged: its history recorded \(recorded), "
                + "but the flow code (version \(subject.codeVersion); the run started with version \(subject.startedVersion)) asks for \(asked). "
                + "The run is stopped and not advanced. Start it over with `hopctl restart --flow \(subject.flow) --subject \(subject.subject)`."
        )
    }

    /// What the body gets from a recorded end of a hop.
    private static func output(of end: HistoryEntry) -> StepOutput {
        switch end.kind {
        case .timeout: StepOutput(json: nil, ending: .timedOut)
        case .reroute: StepOutput(json: nil, ending: .rerouted)
        default: StepOutput(json: end.value)
        }
    }
}
