/* ubitrain runtime: file-backed storage (host, tests).
 *
 * The storage contract (ub_storage.h) asks that a write that returned UB_OK be durable: on a
 * POSIX system every write is followed by fsync of the file, and of its directory when the
 * write created it, so that a crash after a save cannot lose it to the page cache (unless the
 * storage is scratch, `durable` = 0: paged tensors need not outlive the process). A block's
 * file is never opened through a symbolic link (O_NOFOLLOW): a link planted at a slot path
 * makes the save fail rather than overwrite the link's target. Elsewhere, plain stdio. */
#if defined(__unix__) || defined(__APPLE__)
#define _POSIX_C_SOURCE 200809L
#endif
#include "ub_storage_file.h"

#include <stdio.h>
#include <string.h>

#include "ub_status.h"

#if defined(__unix__) || defined(__APPLE__)
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#define UB_POSIX_FILES 1
#endif

static int block_path(const ub_file_storage *files, uint32_t block, char *path, size_t size) {
    int n = snprintf(path, size, "%s.%u", files->prefix, (unsigned)block);
    return n > 0 && (size_t)n < size;
}

#if UB_POSIX_FILES
static int32_t file_read(void *user, uint32_t block, uint32_t offset, void *dst, uint32_t n) {
    char path[sizeof ((ub_file_storage *)0)->prefix + 16];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return UB_ERR_STORAGE;
    uint8_t *p = (uint8_t *)dst;
    uint32_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, p + done, n - done, (off_t)offset + done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (uint32_t)k;
    }
    close(fd);
    return done == n ? UB_OK : UB_ERR_STORAGE;
}

/* fsync of the directory holding `path`, so that a file it just created survives a crash. */
static int sync_directory(const char *path) {
    char dir[sizeof ((ub_file_storage *)0)->prefix + 16];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        strcpy(dir, ".");
    } else {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return 0;
    int ok = fsync(fd) == 0 || errno == EINVAL;  /* some file systems cannot sync a directory */
    close(fd);
    return ok;
}

static int32_t file_write(void *user, uint32_t block, uint32_t offset, const void *src,
                          uint32_t n) {
    char path[sizeof ((ub_file_storage *)0)->prefix + 16];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    int fd = open(path, O_WRONLY | O_NOFOLLOW);
    int created = 0;
    if (fd < 0 && errno == ENOENT) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
        created = 1;
    }
    if (fd < 0) return UB_ERR_STORAGE;
    const uint8_t *p = (const uint8_t *)src;
    uint32_t done = 0;
    while (done < n) {
        ssize_t k = pwrite(fd, p + done, n - done, (off_t)offset + done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (uint32_t)k;
    }
    const int durable = ((const ub_file_storage *)user)->durable;
    int ok = done == n && (!durable || fsync(fd) == 0);
    ok = close(fd) == 0 && ok;
    if (ok && created && durable) ok = sync_directory(path);
    return ok ? UB_OK : UB_ERR_STORAGE;
}
#else
static int32_t file_read(void *user, uint32_t block, uint32_t offset, void *dst, uint32_t n) {
    char path[sizeof ((ub_file_storage *)0)->prefix + 16];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return UB_ERR_STORAGE;
    int ok = fseek(f, (long)offset, SEEK_SET) == 0 && fread(dst, 1, n, f) == n;
    fclose(f);
    return ok ? UB_OK : UB_ERR_STORAGE;
}

static int32_t file_write(void *user, uint32_t block, uint32_t offset, const void *src,
                          uint32_t n) {
    char path[sizeof ((ub_file_storage *)0)->prefix + 16];
    if (!block_path((const ub_file_storage *)user, block, path, sizeof path)) return UB_ERR_STORAGE;
    FILE *f = fopen(path, "r+b");
    if (f == NULL) f = fopen(path, "w+b");
    if (f == NULL) return UB_ERR_STORAGE;
    int ok = fseek(f, (long)offset, SEEK_SET) == 0 && fwrite(src, 1, n, f) == n;
    ok = (fflush(f) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    return ok ? UB_OK : UB_ERR_STORAGE;
}
#endif

int32_t ub_file_storage_open(ub_file_storage *files, ub_storage *storage, const char *prefix) {
    if (files == NULL || storage == NULL || prefix == NULL) return UB_ERR_NULL_ARGUMENT;
    if (strlen(prefix) >= sizeof files->prefix) return UB_ERR_SIZE;
    strcpy(files->prefix, prefix);
    files->durable = 1;
    storage->user = files;
    storage->block_bytes = 0x7fffffffu;
    storage->read = file_read;
    storage->write = file_write;
    return UB_OK;
}
