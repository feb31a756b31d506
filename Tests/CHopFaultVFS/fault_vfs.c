#include "CHopFaultVFS.h"

#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Test-only: a VFS that wraps the default one to inject I/O faults and power loss.
// See https://www.sqlite.org/vfs.html for the interface.

static sqlite3_vfs *base;
static sqlite3_vfs fault_vfs;
static sqlite3_io_methods fault_methods;
static atomic_int registered;

static atomic_long calls, syncs, writes, faults;
static atomic_long fail_at, power_loss_at, power_loss_at_write;
static atomic_int fail_code;
static atomic_int faulted_call;

/// A write held until its file is synced (power-loss mode).
typedef struct HeldWrite {
    struct HeldWrite *next;
    sqlite3_int64 offset;
    int amount;
    unsigned char data[];
} HeldWrite;

typedef struct FaultFile {
    sqlite3_file base;        // must be first: SQLite sees a FaultFile as a sqlite3_file
    sqlite3_file *real;       // the wrapped file, allocated right after this struct
    HeldWrite *held;          // oldest first
    HeldWrite *last;
} FaultFile;

static sqlite3_mutex *held_mutex(void) { return sqlite3_mutex_alloc(SQLITE_MUTEX_STATIC_VFS1); }

/// Counts a call of `kind` ('w', 's', 't' or 'f'); returns the code to fail it with, or SQLITE_OK.
static int count_call(int kind) {
    long n = atomic_fetch_add(&calls, 1) + 1;
    long at = atomic_load(&fail_at);
    if (at > 0 && n == at) {
        atomic_fetch_add(&faults, 1);
        atomic_store(&faulted_call, kind);
        return atomic_load(&fail_code);
    }
    return SQLITE_OK;
}

static int power_loss_armed(void) { return atomic_load(&power_loss_at) > 0 || atomic_load(&power_loss_at_write) > 0; }

static void drop_held(FaultFile *file) {
    HeldWrite *write = file->held;
    while (write) {
        HeldWrite *next = write->next;
        free(write);
        write = next;
    }
    file->held = file->last = NULL;
}

static int apply_held(FaultFile *file) {
    for (HeldWrite *write = file->held; write; write = write->next) {
        int rc = file->real->pMethods->xWrite(file->real, write->data, write->amount, write->offset);
        if (rc != SQLITE_OK) return rc;
    }
    drop_held(file);
    return SQLITE_OK;
}

static int x_close(sqlite3_file *f) {
    FaultFile *file = (FaultFile *)f;
    sqlite3_mutex_enter(held_mutex());
    // A file closed without a sync keeps its writes only if the power stays on.
    if (!power_loss_armed()) apply_held(file);
    drop_held(file);
    sqlite3_mutex_leave(held_mutex());
    return file->real->pMethods->xClose(file->real);
}

static int x_read(sqlite3_file *f, void *buffer, int amount, sqlite3_int64 offset) {
    FaultFile *file = (FaultFile *)f;
    sqlite3_mutex_enter(held_mutex());
    int rc = file->real->pMethods->xRead(file->real, buffer, amount, offset);
    if (file->held && (rc == SQLITE_OK || rc == SQLITE_IOERR_SHORT_READ)) {
        sqlite3_int64 real_size = 0;
        file->real->pMethods->xFileSize(file->real, &real_size);
        sqlite3_int64 covered = real_size;
        for (HeldWrite *write = file->held; write; write = write->next) {
            sqlite3_int64 start = write->offset > offset ? write->offset : offset;
            sqlite3_int64 end = write->offset + write->amount < offset + amount ? write->offset + write->amount : offset + amount;
            if (start < end) memcpy((unsigned char *)buffer + (start - offset), write->data + (start - write->offset), (size_t)(end - start));
            if (write->offset + write->amount > covered) covered = write->offset + write->amount;
        }
        rc = covered >= offset + amount ? SQLITE_OK : SQLITE_IOERR_SHORT_READ;
    }
    sqlite3_mutex_leave(held_mutex());
    return rc;
}

static int x_write(sqlite3_file *f, const void *data, int amount, sqlite3_int64 offset) {
    FaultFile *file = (FaultFile *)f;
    int rc = count_call('w');
    if (rc != SQLITE_OK) return rc;
    long n = atomic_fetch_add(&writes, 1) + 1;
    long cut = atomic_load(&power_loss_at_write);
    if (cut > 0 && n >= cut) _exit(86);  // the power goes before this write: unsynced writes are lost
    if (!power_loss_armed()) return file->real->pMethods->xWrite(file->real, data, amount, offset);
    HeldWrite *write = malloc(sizeof(HeldWrite) + (size_t)amount);
    if (!write) return SQLITE_IOERR_NOMEM;
    write->next = NULL;
    write->offset = offset;
    write->amount = amount;
    memcpy(write->data, data, (size_t)amount);
    sqlite3_mutex_enter(held_mutex());
    if (file->last) file->last->next = write; else file->held = write;
    file->last = write;
    sqlite3_mutex_leave(held_mutex());
    return SQLITE_OK;
}

static int x_truncate(sqlite3_file *f, sqlite3_int64 size) {
    FaultFile *file = (FaultFile *)f;
    int rc = count_call('t');
    if (rc != SQLITE_OK) return rc;
    sqlite3_mutex_enter(held_mutex());
    // Truncation is applied at once (the held writes first): a simplification of the model.
    rc = apply_held(file);
    sqlite3_mutex_leave(held_mutex());
    if (rc != SQLITE_OK) return rc;
    return file->real->pMethods->xTruncate(file->real, size);
}

static int x_sync(sqlite3_file *f, int flags) {
    FaultFile *file = (FaultFile *)f;
    int rc = count_call('s');
    if (rc != SQLITE_OK) return rc;
    long n = atomic_fetch_add(&syncs, 1) + 1;
    long cut = atomic_load(&power_loss_at);
    if (cut > 0 && n >= cut) {
        // The power goes: every write not yet synced is lost, and so is the process.
        _exit(86);
    }
    sqlite3_mutex_enter(held_mutex());
    rc = apply_held(file);
    sqlite3_mutex_leave(held_mutex());
    if (rc != SQLITE_OK) return rc;
    return file->real->pMethods->xSync(file->real, flags);
}

static int x_file_size(sqlite3_file *f, sqlite3_int64 *size) {
    FaultFile *file = (FaultFile *)f;
    int rc = count_call('f');
    if (rc != SQLITE_OK) return rc;
    rc = file->real->pMethods->xFileSize(file->real, size);
    if (rc != SQLITE_OK) return rc;
    sqlite3_mutex_enter(held_mutex());
    for (HeldWrite *write = file->held; write; write = write->next) {
        if (write->offset + write->amount > *size) *size = write->offset + write->amount;
    }
    sqlite3_mutex_leave(held_mutex());
    return SQLITE_OK;
}

#define REAL(f) (((FaultFile *)(f))->real)
static int x_lock(sqlite3_file *f, int level) { return REAL(f)->pMethods->xLock(REAL(f), level); }
static int x_unlock(sqlite3_file *f, int level) { return REAL(f)->pMethods->xUnlock(REAL(f), level); }
static int x_check_reserved_lock(sqlite3_file *f, int *out) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out); }
static int x_file_control(sqlite3_file *f, int op, void *arg) { return REAL(f)->pMethods->xFileControl(REAL(f), op, arg); }
static int x_sector_size(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int x_device_characteristics(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int x_shm_map(sqlite3_file *f, int page, int size, int extend, void volatile **out) {
    return REAL(f)->pMethods->xShmMap(REAL(f), page, size, extend, out);
}
static int x_shm_lock(sqlite3_file *f, int offset, int n, int flags) { return REAL(f)->pMethods->xShmLock(REAL(f), offset, n, flags); }
static void x_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int x_shm_unmap(sqlite3_file *f, int delete_flag) { return REAL(f)->pMethods->xShmUnmap(REAL(f), delete_flag); }

static int x_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags) {
    (void)vfs;
    FaultFile *file = (FaultFile *)f;
    memset(file, 0, sizeof(FaultFile));
    file->real = (sqlite3_file *)(file + 1);
    int rc = base->xOpen(base, name, file->real, flags, out_flags);
    if (rc != SQLITE_OK || !file->real->pMethods) {
        file->base.pMethods = NULL;
        return rc;
    }
    fault_methods.iVersion = file->real->pMethods->iVersion < 2 ? file->real->pMethods->iVersion : 2;
    file->base.pMethods = &fault_methods;
    return SQLITE_OK;
}

static int x_delete(sqlite3_vfs *v, const char *name, int sync_dir) { (void)v; return base->xDelete(base, name, sync_dir); }
static int x_access(sqlite3_vfs *v, const char *name, int flags, int *out) { (void)v; return base->xAccess(base, name, flags, out); }
static int x_full_pathname(sqlite3_vfs *v, const char *name, int n, char *out) { (void)v; return base->xFullPathname(base, name, n, out); }
static void *x_dl_open(sqlite3_vfs *v, const char *name) { (void)v; return base->xDlOpen(base, name); }
static void x_dl_error(sqlite3_vfs *v, int n, char *out) { (void)v; base->xDlError(base, n, out); }
static void (*x_dl_sym(sqlite3_vfs *v, void *handle, const char *symbol))(void) { (void)v; return base->xDlSym(base, handle, symbol); }
static void x_dl_close(sqlite3_vfs *v, void *handle) { (void)v; base->xDlClose(base, handle); }
static int x_randomness(sqlite3_vfs *v, int n, char *out) { (void)v; return base->xRandomness(base, n, out); }
static int x_sleep(sqlite3_vfs *v, int microseconds) { (void)v; return base->xSleep(base, microseconds); }
static int x_current_time(sqlite3_vfs *v, double *out) { (void)v; return base->xCurrentTime(base, out); }
static int x_get_last_error(sqlite3_vfs *v, int n, char *out) { (void)v; return base->xGetLastError(base, n, out); }
static int x_current_time_int64(sqlite3_vfs *v, sqlite3_int64 *out) { (void)v; return base->xCurrentTimeInt64(base, out); }

int hop_fault_vfs_register(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&registered, &expected, 1)) return SQLITE_OK;
    base = sqlite3_vfs_find(NULL);
    if (!base) return SQLITE_ERROR;
    fault_methods = (sqlite3_io_methods){
        .iVersion = 2,
        .xClose = x_close, .xRead = x_read, .xWrite = x_write, .xTruncate = x_truncate, .xSync = x_sync,
        .xFileSize = x_file_size, .xLock = x_lock, .xUnlock = x_unlock, .xCheckReservedLock = x_check_reserved_lock,
        .xFileControl = x_file_control, .xSectorSize = x_sector_size, .xDeviceCharacteristics = x_device_characteristics,
        .xShmMap = x_shm_map, .xShmLock = x_shm_lock, .xShmBarrier = x_shm_barrier, .xShmUnmap = x_shm_unmap,
    };
    fault_vfs = (sqlite3_vfs){
        .iVersion = 2, .szOsFile = (int)sizeof(FaultFile) + base->szOsFile, .mxPathname = base->mxPathname,
        .zName = "hopfault", .xOpen = x_open, .xDelete = x_delete, .xAccess = x_access, .xFullPathname = x_full_pathname,
        .xDlOpen = x_dl_open, .xDlError = x_dl_error, .xDlSym = x_dl_sym, .xDlClose = x_dl_close,
        .xRandomness = x_randomness, .xSleep = x_sleep, .xCurrentTime = x_current_time,
        .xGetLastError = x_get_last_error, .xCurrentTimeInt64 = x_current_time_int64,
    };
    return sqlite3_vfs_register(&fault_vfs, 0);
}

static void arm(long fail, int code, long power, long power_at_write) {
    atomic_store(&calls, 0);
    atomic_store(&syncs, 0);
    atomic_store(&writes, 0);
    atomic_store(&faults, 0);
    atomic_store(&faulted_call, 0);
    atomic_store(&fail_code, code);
    atomic_store(&fail_at, fail);
    atomic_store(&power_loss_at, power);
    atomic_store(&power_loss_at_write, power_at_write);
}

void hop_fault_vfs_fail_at(long n, int code) { arm(n, code, 0, 0); }
void hop_fault_vfs_power_loss_at(long n) { arm(0, 0, n, 0); }
void hop_fault_vfs_power_loss_at_write(long n) { arm(0, 0, 0, n); }
long hop_fault_vfs_calls(void) { return atomic_load(&calls); }
long hop_fault_vfs_syncs(void) { return atomic_load(&syncs); }
long hop_fault_vfs_faults(void) { return atomic_load(&faults); }
int hop_fault_vfs_faulted_call(void) { return atomic_load(&faulted_call); }
