import HopStore

/// Whether the database answers the engine's own loops (its start-up, its watch), as the
/// observer and the `hop_database_up` gauge are told: on a change only, so that an outage is
/// one ``EngineEvent/databaseFailing(_:)`` and one ``EngineEvent/databaseAnswers``, not an
/// event per failed poll.
struct DatabaseHealth {
    /// Whether the last call failed the database; `nil` before the first.
    private var failing: Bool?

    /// Notes that the database failed with `error`. Another error (a flow that is no longer
    /// registered, say) says nothing about the database and is ignored.
    mutating func failed(_ error: any Error, _ environment: ExecutionEnvironment) {
        guard let error = error as? HopError, error.isDatabaseFailure, failing != true else { return }
        failing = true
        environment.metrics.databaseUp.record(0)
        environment.notify(.databaseFailing(error))
    }

    /// Notes that the database answered.
    mutating func answered(_ environment: ExecutionEnvironment) {
        guard failing != false else { return }
        defer { failing = false }
        environment.metrics.databaseUp.record(1)
        if failing == true { environment.notify(.databaseAnswers) }
    }
}
