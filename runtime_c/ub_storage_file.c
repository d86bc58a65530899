/* ubitrain runtime: file-backed storage (host, tests). */
#include "ub_storage_file.h"

#include <stdio.h>
#include <string.h>

#include "ub_status.h"

static int block_path(const ub_file_storage *files, uint32_t block, char *path, size_t size) {
    int n = snprintf(path, size, "%s.%u", files->prefix, (unsigned)block);
    return n > 0 && (size_t)n < size;
}

static int32_t file_read(void *user, uint32_t block, uint32_t offset, void *dst, uint32_t n) {
    char path[256];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return UB_ERR_STORAGE;
    int ok = fseek(f, (long)offset, SEEK_SET) == 0 && fread(dst, 1, n, f) == n;
    fclose(f);
    return ok ? UB_OK : UB_ERR_STORAGE;
}

static int32_t file_write(void *user, uint32_t block, uint32_t offset, const void *src,
                          uint32_t n) {
    char path[256];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    FILE *f = fopen(path, "r+b");
    if (f == NULL) f = fopen(path, "w+b");
    if (f == NULL) return UB_ERR_STORAGE;
    int ok = fseek(f, (long)offset, SEEK_SET) == 0 && fwrite(src, 1, n, f) == n;
    ok = (fflush(f) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    return ok ? UB_OK : UB_ERR_STORAGE;
}

int32_t ub_file_storage_open(ub_file_storage *files, ub_storage *storage, const char *prefix) {
    if (files == NULL || storage == NULL || prefix == NULL) return UB_ERR_NULL_ARGUMENT;
    if (strlen(prefix) + 12 >= sizeof files->prefix) return UB_ERR_SIZE;
    strcpy(files->prefix, prefix);
    storage->user = files;
    storage->block_bytes = 0x7fffffffu;
    storage->read = file_read;
    storage->write = file_write;
    return UB_OK;
}
