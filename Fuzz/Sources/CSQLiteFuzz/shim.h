#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

// libFuzzer's driver, from libclang_rt.fuzzer_no_main (linked by script/fuzz).
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
