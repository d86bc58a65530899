/* ubitrain runtime: a file-backed ub_storage for the host and tests: block b is the file
 * "<prefix>.<b>". Needs stdio; not built for freestanding targets. */
#ifndef UB_STORAGE_FILE_H
#define UB_STORAGE_FILE_H

#include "ub_storage.h"

typedef struct {
    char prefix[240];
} ub_file_storage;

/* Set up `storage` over files named "<prefix>.<block>". */
int32_t ub_file_storage_open(ub_file_storage *files, ub_storage *storage, const char *prefix);

#endif
