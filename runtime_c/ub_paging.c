/* ubitrain runtime: paging tensors through a ub_storage (see ub_paging.h). */
#include "ub_paging.h"

#include <stddef.h>

#include "ub_status.h"

static int32_t ub_page_check(const ub_storage *storage, const void *data, uint32_t n) {
    if (storage == NULL || data == NULL) return UB_ERR_NO_PAGE_STORAGE;
    if (storage->read == NULL || storage->write == NULL) return UB_ERR_NO_PAGE_STORAGE;
    return n <= storage->block_bytes ? UB_OK : UB_ERR_SIZE;
}

int32_t ub_page_out(const ub_storage *storage, uint32_t page, const void *src, uint32_t n) {
    int32_t status = ub_page_check(storage, src, n);
    if (status != UB_OK) return status;
    return storage->write(storage->user, UB_PAGE_BLOCK_BASE + page, 0u, src, n);
}

int32_t ub_page_in(const ub_storage *storage, uint32_t page, void *dst, uint32_t n) {
    int32_t status = ub_page_check(storage, dst, n);
    if (status != UB_OK) return status;
    return storage->read(storage->user, UB_PAGE_BLOCK_BASE + page, 0u, dst, n);
}
