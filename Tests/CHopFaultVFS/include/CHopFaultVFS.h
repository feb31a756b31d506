#ifndef CHOP_FAULT_VFS_H
#define CHOP_FAULT_VFS_H

/// A test-only SQLite VFS, "hopfault", over the default unix VFS.
///
/// Fault mode: the Nth counted call (xWrite, xSync, xTruncate, xFileSize, on any file) fails
/// with the given SQLite result code; later calls succeed again.
///
/// Power-loss mode: writes are held in memory until their file is synced; at the Nth sync (or
/// just before the Nth write) the held writes of every file are dropped and the process ends at
/// once with exit status 86, as if the power had been cut there.

/// Registers the VFS (once; later calls do nothing). Returns an SQLite result code.
int hop_fault_vfs_register(void);

/// Fails the `n`th counted call from now on with `code` (e.g. SQLITE_IOERR_WRITE, SQLITE_FULL); 0 disables.
void hop_fault_vfs_fail_at(long n, int code);

/// Cuts the power at the `n`th sync from now on (held writes are dropped, the process exits 86); 0 disables.
void hop_fault_vfs_power_loss_at(long n);

/// Cuts the power just before the `n`th write from now on (held writes are dropped, the process exits 86); 0 disables.
void hop_fault_vfs_power_loss_at_write(long n);

/// Counted calls (write, sync, truncate, file size) since the last arming.
long hop_fault_vfs_calls(void);

/// Syncs since the last arming.
long hop_fault_vfs_syncs(void);

/// Faults injected since the last arming.
long hop_fault_vfs_faults(void);

/// The kind of call the last fault failed: 'w' (write), 's' (sync), 't' (truncate), 'f' (file
/// size); 0 when none failed since the last arming.
int hop_fault_vfs_faulted_call(void);

#endif
