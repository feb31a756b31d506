import HopPostgres
import HopctlCommands

// hopctl's commands with the PostgreSQL client: hopctl hands it the command lines that name a
// server's database (--db postgres://…, HOP_DB, copy --from/--to). Files work here too.
OpenDatabases.register { url, migrate in
    let store = try await PostgresStore.open(url: url, migrate: migrate)
    return (store: store, close: { await store.close() })
}
await Hopctl.runCommandLine()
