/* ubitrain runtime: a file-backed ub_storage for the host and tests: block b is the file
 * "<prefix>.<b>". Needs stdio; not built for freestanding targets. */
#ifndef UB_STORAGE_FILE_H
#define UB_STORAGE_FILE_H

#include "ub_storage.h"

#define UB_FILE_STORAGE_PREFIX_BYTES 1024

typedef struct {
    char prefix[UB_FILE_STORAGE_PREFIX_BYTES];
    int32_t durable; /* 1 (open's default): every write is synced to disk; 0: scratch (paging) */
} ub_file_storage;

/* Set up `storage` over files named "<prefix>.<block>"; UB_ERR_SIZE when the prefix (with its
 * terminating zero) does not fit UB_FILE_STORAGE_PREFIX_BYTES. */
int32_t ub_file_storage_open(ub_file_storage *files, ub_storage *storage, const char *prefix);

#endif
