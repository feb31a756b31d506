/// The runs waiting for a place to execute (``HopEngine/Configuration/maxConcurrentRuns``),
/// first come first served: a queue that also answers whether a run waits.
struct WaitingRuns {
    private var runs: [RunRecord] = []
    private var head = 0
    private var ids: Set<Int64> = []

    var count: Int { ids.count }
    var isEmpty: Bool { ids.isEmpty }

    func contains(_ runID: Int64) -> Bool { ids.contains(runID) }

    /// Adds `run` at the end, unless it already waits.
    mutating func append(_ run: RunRecord) {
        guard ids.insert(run.id).inserted else { return }
        runs.append(run)
    }

    /// The run that has waited longest.
    mutating func next() -> RunRecord? {
        guard head < runs.count else { return nil }
        let run = runs[head]
        head += 1
        if head > 1024 && head * 2 > runs.count {
            runs.removeFirst(head)
            head = 0
        }
        ids.remove(run.id)
        return run
    }
}
