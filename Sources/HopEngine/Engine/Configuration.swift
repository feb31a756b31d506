import CoreMetrics
import Logging
import Tracing

extension HopEngine {
    /// How an engine behaves.
    public struct Configuration: Sendable {
        /// How often the engine checks the database for changes made by other processes
        /// (an unhop, a cancellation, a logout by `hopctl`) and for steps whose deadline passed.
        /// At least ``shortestPollInterval``: a shorter one is taken as that, with a warning.
        public var pollInterval: Duration = .milliseconds(50)
        /// How long a lease on a run lasts. The engine renews its leases three times per
        /// period; when its process dies, another engine takes its runs over once they expire.
        /// At least ``shortestLeaseDuration``: a shorter one is taken as that, with a warning.
        public var leaseDuration: Duration = .seconds(10)
        /// How often the engine looks for engines whose process is gone (their liveness lock is
        /// free), to take their runs over without waiting for the leases to expire; besides, it
        /// looks when it starts and whenever a run it claims is held. Each look reads the owners
        /// of the running runs (on PostgreSQL, and the server's locks): at every poll, a fleet
        /// of N engines made N² such reads 20 times a second. Of N engines, the first to look
        /// takes the runs over: a second at most, and the more engines the sooner.
        public var deadEngineCheckInterval: Duration = .seconds(1)
        /// Called with each ``EngineEvent``.
        public var observer: (@Sendable (EngineEvent) -> Void)?
        /// Where metrics go; the process's `MetricsSystem` when `nil`.
        public var metricsFactory: (any MetricsFactory)?
        /// Where spans go (one per execution of a run, one per step it enters); the process's
        /// `InstrumentationSystem.tracer` when `nil`, which traces nothing until the daemon
        /// bootstraps a tracer.
        public var tracer: (any Tracer)?
        /// A readable label for this daemon, e.g. `"kiosk-agent@device-17"`, shown by
        /// `hopctl status` and in takeover entries of history; host and process id by default.
        /// It is only a label: ownership of runs goes by the engine's ``HopEngine/incarnation``,
        /// so any number of processes may share a label without ever executing a run twice.
        public var engineID: String?
        /// How many runs this engine executes at once, at most: each holds a task (and its
        /// step's memory) while it executes. Runs asked to execute beyond it wait their turn,
        /// oldest first; a resume claims only as many runs as there are free places, leaving
        /// the rest in the database (for this engine later, or another engine now). Runs parked
        /// on an external step hold no place. At least 1: a smaller number is taken as 1, with a
        /// warning.
        public var maxConcurrentRuns = 10_000
        /// Removes finished runs and their history periodically while the engine runs (as
        /// `hopctl prune` does); `nil`, the default, keeps every run.
        public var retention: Retention?
        /// What the engine does with a run whose lease it could not renew before the lease
        /// ended, by its own clock: go on executing its step (``LapsedLeases/keepExecuting``,
        /// the default) or stop it (``LapsedLeases/stopExecuting``). Only an engine cut off from
        /// its database for longer than a lease meets one; see ``LapsedLeases`` for the trade.
        public var lapsedLeases: LapsedLeases = .keepExecuting
        /// How long the unhop of a step that returned waits for its run's next record before it
        /// is written alone (`HeldUnhops`); tests lengthen it to hold one on purpose.
        package var heldUnhopLimit: Duration = .milliseconds(2)

        public init(
            pollInterval: Duration = .milliseconds(50), leaseDuration: Duration = .seconds(10),
            observer: (@Sendable (EngineEvent) -> Void)? = nil, metricsFactory: (any MetricsFactory)? = nil,
            engineID: String? = nil, maxConcurrentRuns: Int = 10_000, retention: Retention? = nil,
            tracer: (any Tracer)? = nil, deadEngineCheckInterval: Duration = .seconds(1),
            lapsedLeases: LapsedLeases = .keepExecuting
        ) {
            self.lapsedLeases = lapsedLeases
            self.deadEngineCheckInterval = deadEngineCheckInterval
            self.tracer = tracer
            self.retention = retention
            self.maxConcurrentRuns = maxConcurrentRuns
            self.pollInterval = pollInterval
            self.leaseDuration = leaseDuration
            self.observer = observer
            self.metricsFactory = metricsFactory
            self.engineID = engineID
        }
    }
}

extension HopEngine.Configuration {
    /// The shortest ``pollInterval`` an engine keeps: a shorter one (zero, say) would have the
    /// watch poll without pause, a core busy for nothing; it is taken as this.
    public static let shortestPollInterval = Duration.milliseconds(5)
    /// The shortest ``leaseDuration`` an engine keeps: a shorter one would have its leases
    /// expire before it renews them (other engines taking over runs it still executes) and its
    /// renewals run without pause; it is taken as this.
    public static let shortestLeaseDuration = Duration.seconds(1)

    /// This configuration with each setting that cannot work taken as the nearest that can,
    /// and a warning logged for each: ``pollInterval`` and ``leaseDuration`` at least their
    /// shortest, ``maxConcurrentRuns`` at least 1 (with none, no run would ever execute).
    func adjusted(logger: Logger) -> Self {
        var adjusted = self
        func warn(_ setting: String, _ given: String, _ used: String) {
            logger.warning(
                "configuration: \(setting) \(given) cannot work; \(used) is used",
                metadata: ["hop.setting": "\(setting)"])
        }
        if pollInterval < Self.shortestPollInterval {
            adjusted.pollInterval = Self.shortestPollInterval
            warn("pollInterval", "\(pollInterval)", "\(Self.shortestPollInterval), the shortest")
        }
        if leaseDuration < Self.shortestLeaseDuration {
            adjusted.leaseDuration = Self.shortestLeaseDuration
            warn("leaseDuration", "\(leaseDuration)", "\(Self.shortestLeaseDuration), the shortest")
        }
        if maxConcurrentRuns < 1 {
            adjusted.maxConcurrentRuns = 1
            warn("maxConcurrentRuns", "\(maxConcurrentRuns)", "1")
        }
        return adjusted
    }
}

extension HopEngine {
    /// What an engine does with the runs whose leases it could not renew before they ended:
    /// its database did not answer it for as long as a lease (a network partition, a server
    /// stopped, restarted or failed over, a process frozen past its lease).
    ///
    /// The engine cannot tell a server that is away (which hands no run to any engine meanwhile,
    /// and grants every engine 15 s after it starts to renew its leases) from a server that runs
    /// on without it (where another engine takes each run over once its lease has expired). The
    /// choice is between two costs.
    public enum LapsedLeases: Sendable, Hashable {
        /// Go on executing the steps: a step runs once across a server's restart or failover,
        /// however long. When the server ran on, another engine takes the runs over once their
        /// leases expired and enters their steps again while they still run here, until this
        /// engine hears from the database again; it then stops them and writes nothing more to
        /// them (every write is fenced by owner).
        case keepExecuting
        /// Stop executing (cancel the steps of) every run whose lease was neither renewed nor
        /// taken in the last ``Configuration/leaseDuration`` less a tenth of it (at most a second),
        /// by this process's monotonic clock: from then on another engine may take the run over,
        /// and finds its step stopped here. Once the database answers, this engine executes
        /// again, from their history, those no other engine took over meanwhile: their steps run
        /// again, after a restart or failover of the server too. For steps that must never run
        /// on two engines at once. (On a file, an engine whose renewals only wait for another
        /// process's write lock keeps its runs, and does not stop their steps while it waits.)
        case stopExecuting
    }

    /// Which finished runs a running engine removes, and how often it looks (see
    /// ``Configuration/retention``). Unfinished runs, first-use flags and sessions are never
    /// removed; each prune goes a batch of runs per transaction, beside the engine's own writes.
    /// A retention that can never be meant (a negative ``finishedAfter`` or ``keepLast``, a
    /// ``flow`` that is no name) removes nothing: the engine says so once, at the error level,
    /// and runs without it.
    public struct Retention: Sendable, Equatable {
        /// Runs that finished longer ago than this are removed.
        public var finishedAfter: Duration
        /// The newest runs of each flow and subject kept whatever their age (1: `hopctl status`
        /// still shows how each subject's flow last ended).
        public var keepLast: Int
        /// Only runs of this flow; every flow when `nil`.
        public var flow: String?
        /// How often the engine prunes; the first prune comes when the engine has resumed its
        /// runs. At least ``shortestInterval``: a shorter one is taken as that.
        public var interval: Duration

        /// The shortest ``interval`` an engine keeps between two prunes.
        public static let shortestInterval = Duration.milliseconds(100)

        public init(
            finishedAfter: Duration, keepLast: Int = 1, flow: String? = nil, interval: Duration = .seconds(3600)
        ) {
            self.finishedAfter = finishedAfter
            self.keepLast = keepLast
            self.flow = flow
            self.interval = interval
        }

        /// Refuses a ``flow`` that is no name, and a negative ``finishedAfter`` or ``keepLast``, each
        /// a mistake: taken as zero, the first removes every run as soon as it finishes, the
        /// second each subject's latest run.
        func validate() throws {
            if let flow { try Identifier.validate(flow, as: "flow name") }
            _ = try KeptRuns(keepLast: keepLast)  // refused as a prune refuses it
            if finishedAfter < .zero {
                throw HopError(
                    .invalidInput,
                    "finishedAfter is \(finishedAfter): how long finished runs are kept cannot be negative",
                    hint: "Give how long a finished run is kept, e.g. .seconds(30 * 86_400) for 30 days")
            }
        }
    }
}
