// A daemon imports one module: the engine's API returns and takes the store's types (runs,
// history entries, sessions, errors) and a daemon opens its database with `HopStore.open`.
@_exported import HopStore
