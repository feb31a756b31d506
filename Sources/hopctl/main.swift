import HopctlCommands

#if canImport(Glibc)
import Glibc
#endif

// hopctl on a SQLite file; a command line naming a PostgreSQL database goes to hopctl-postgres.
if PostgresHandOff.isNeeded(
    arguments: Array(CommandLine.arguments.dropFirst()), hopDB: getenv("HOP_DB").map { String(cString: $0) })
{
    PostgresHandOff.handOff()
}
await Hopctl.runCommandLine()
