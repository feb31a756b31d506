import HopPostgres
import HopStore
import Testing
import _ConnectionPoolModule

/// What HopPostgres makes of the errors of PostgreSQL's client that it has no type for.
@Suite struct PostgresErrorTests {
    /// While the server is away, the client's pool holds each query until it has failed to
    /// connect for a minute, then fails them all. An engine's log said so in the pool's own
    /// words (`ConnectionPoolError(base: _ConnectionPoolModule.ConnectionPoolError.Base.connectionCreationCircuitBreakerTripped)`),
    /// naming neither the server nor what to check.
    @Test func aPoolThatGaveUpConnectingSaysSoAndWhatToCheck() {
        let error = PostgresStore.map(
            ConnectionPoolError.connectionCreationCircuitBreakerTripped, operation: "renew leases",
            location: "postgres://hop@db.example/hop")
        #expect(error.code == .postgres && error.mayPass)
        #expect(error.reason == "cannot connect to the server: every try for a minute failed")
        #expect(error.hint?.contains("Check that PostgreSQL runs") == true)
        #expect(!"\(error)".contains("ConnectionPool"), "\(error)")
    }

    /// A query cancelled while it waited for a connection (its engine stops) is said to be
    /// cancelled, as a cancelled query is.
    @Test func aRequestCancelledWhileItWaitedIsCancelled() {
        let error = PostgresStore.map(
            ConnectionPoolError.requestCancelled, operation: "renew leases", location: "postgres://hop@db.example/hop")
        #expect(error.reason == "cancelled")
        #expect(!"\(error)".contains("ConnectionPool"), "\(error)")
    }
}
