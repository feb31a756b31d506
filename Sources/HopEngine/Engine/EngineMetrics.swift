import CoreMetrics
import Synchronization

/// The engine's metrics, through swift-metrics: counters of hops, unhops, resumes,
/// divergences and runs this engine stopped executing because it lost them, a timer of step
/// durations by step, and whether the database answers.
final class EngineMetrics: Sendable {
    let factory: any MetricsFactory
    let hops: Counter
    let unhops: Counter
    let resumes: Counter
    let divergences: Counter
    /// Runs this engine stopped executing because another engine took them over (this one
    /// was stalled or cut off past its lease).
    let runsTakenOver: Counter
    /// Runs this engine stopped executing because it could not renew their leases in time
    /// (``HopEngine/LapsedLeases/stopExecuting``).
    let runsLapsed: Counter
    /// 1 while the database answers the engine, 0 while it fails (``EngineEvent/databaseFailing(_:)``);
    /// no value before the engine's first call.
    let databaseUp: Gauge
    /// One timer per step, made on its first use.
    private let stepTimers = Mutex<[String: Timer]>([:])

    init(factory: any MetricsFactory) {
        self.factory = factory
        hops = Counter(label: "hop_hops_total", factory: factory)
        unhops = Counter(label: "hop_unhops_total", factory: factory)
        resumes = Counter(label: "hop_resumes_total", factory: factory)
        divergences = Counter(label: "hop_divergences_total", factory: factory)
        runsTakenOver = Counter(label: "hop_runs_lost_total", dimensions: [("reason", "taken_over")], factory: factory)
        runsLapsed = Counter(label: "hop_runs_lost_total", dimensions: [("reason", "lease_lapsed")], factory: factory)
        databaseUp = Gauge(label: "hop_database_up", factory: factory)
    }

    func stepDuration(_ step: String, _ duration: Duration) {
        let nanoseconds = duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000
        let timer = stepTimers.withLock { timers in
            if let timer = timers[step] { return timer }
            let timer = Timer(label: "hop_step_duration_seconds", dimensions: [("step", step)], factory: factory)
            timers[step] = timer
            return timer
        }
        timer.recordNanoseconds(nanoseconds)
    }
}
