/* ubitrain runtime: the storage interface that checkpoints (and paging) go through.
 *
 * Storage is a set of numbered blocks, each an array of bytes. The contract a device
 * implementation must keep (flash, an SD card, a file):
 *   - read(block, offset, dst, n) returns exactly the bytes last written there, or fails;
 *     bytes never written may hold anything;
 *   - write(block, offset, src, n) may be cut off by a power loss at any byte: then a prefix
 *     of the bytes is written and the rest keeps its old content (or the erased value);
 *   - a write that returned UB_OK is durable (it survives a power loss);
 *   - a block holds at least `block_bytes` bytes.
 * On NOR/NAND flash, `write` erases pages as needed (the checkpoint writes a slot from its
 * start, header last). No call allocates memory. */
#ifndef UB_STORAGE_H
#define UB_STORAGE_H

#include <stdint.h>

typedef struct ub_storage {
    void *user;
    uint32_t block_bytes;
    int32_t (*read)(void *user, uint32_t block, uint32_t offset, void *dst, uint32_t n);
    int32_t (*write)(void *user, uint32_t block, uint32_t offset, const void *src, uint32_t n);
} ub_storage;

#endif
