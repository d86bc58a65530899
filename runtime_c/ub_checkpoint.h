/* ubitrain runtime: crash-safe checkpoints in two slots (storage blocks 0 and 1).
 *
 * A slot is a 32-byte header then the payload. Saving writes the slot that does NOT hold
 * the newest valid checkpoint: first its header is invalidated, then the payload is written,
 * then the header with the next sequence number, the payload's CRC-32 and the header's own
 * CRC-32. A power loss at any byte leaves the other slot untouched, so restoring always finds
 * the last complete checkpoint (or the one before it), never a mix. Restoring checks both
 * slots (magic, sizes, both CRCs), takes the valid one with the newer sequence number, checks
 * its payload CRC by reading it through a small stack buffer, and only then copies it into
 * the segments: a restore that finds no valid checkpoint changes nothing. */
#ifndef UB_CHECKPOINT_H
#define UB_CHECKPOINT_H

#include <stdint.h>

#include "ub_storage.h"

#define UB_CHECKPOINT_HEADER_BYTES 32u

/* The payload is the concatenation of segments (e.g. a model's step counter, then its
 * arena state), so that nothing needs copying together first. */
typedef struct {
    void *data;
    uint32_t bytes;
} ub_segment;

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of `n` bytes, continuing from `crc`
 * (start with 0). */
uint32_t ub_crc32(uint32_t crc, const void *data, uint32_t n);

/* Save the segments. `model_id` tags the checkpoint (a restore for another model or layout
 * fails with UB_ERR_CHECKPOINT_MISMATCH). */
int32_t ub_checkpoint_save(const ub_storage *storage, uint32_t model_id,
                           const ub_segment *segments, uint32_t count);

/* Restore the newest valid checkpoint whose payload has exactly the segments' total size
 * into the segments; `sequence` (may be NULL) receives its sequence number.
 * UB_ERR_NO_CHECKPOINT when no slot holds one. */
int32_t ub_checkpoint_restore(const ub_storage *storage, uint32_t model_id,
                              const ub_segment *segments, uint32_t count, uint32_t *sequence);

#endif
