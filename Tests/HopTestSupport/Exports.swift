// Engine tests get the store-level helpers (folders, child processes, logs) with the engine's.
@_exported import HopStoreTestSupport
