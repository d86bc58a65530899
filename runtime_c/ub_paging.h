/* ubitrain runtime: paging, i.e. a training step that moves a tensor out of the arena to
 * storage and later reads it back, so that the arena fits a memory budget.
 *
 * The compiler decides which tensors are paged and where (memory/remat_milp.py); the step
 * calls ub_page_out right after a tensor's last use before a long gap and ub_page_in just
 * before its next use. Each paged tensor has its own storage block,
 * UB_PAGE_BLOCK_BASE + <its index>, written from offset 0 (the two checkpoint slots use
 * blocks 0 and 1, so one storage may serve both).
 *
 * What a device's storage (runtime_c/ub_storage.h) must provide for paging:
 *   - blocks of at least the largest paged tensor's bytes (UB_<MODEL>_PAGE_BYTES_MAX);
 *   - read returns the bytes of the last write to that block in this step. Durability is
 *     NOT needed: a power loss loses the step anyway, and the step restarts from the arena
 *     state (or a checkpoint) with every page written again before it is read;
 *   - on NOR/NAND flash, write erases as needed. Every step rewrites every paged block, so
 *     the flash must be sized for that wear (NOR: ~100k erase cycles per sector; spread the
 *     blocks over a wear-levelled region or an SD card, or prefer recomputation there);
 *   - no allocation, and no other use of the blocks during a step.
 * Every call returns UB_OK or a negative status; the generated step returns it unchanged. */
#ifndef UB_PAGING_H
#define UB_PAGING_H

#include <stdint.h>

#include "ub_storage.h"

#define UB_PAGE_BLOCK_BASE 16u

/* Write `n` bytes of `src` to page `page` (storage block UB_PAGE_BLOCK_BASE + page). */
int32_t ub_page_out(const ub_storage *storage, uint32_t page, const void *src, uint32_t n);

/* Read page `page` back into `dst` (`n` bytes, as written). */
int32_t ub_page_in(const ub_storage *storage, uint32_t page, void *dst, uint32_t n);

#endif
