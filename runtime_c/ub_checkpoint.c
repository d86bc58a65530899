/* ubitrain runtime: crash-safe two-slot checkpoints (see ub_checkpoint.h). */
#include "ub_checkpoint.h"

#include <stddef.h>

#include "ub_status.h"

#define UB_CHECKPOINT_MAGIC 0x4B434255u /* "UBCK" */
#define UB_CHECKPOINT_VERSION 1u

typedef struct {
    uint32_t model_id, sequence, payload_bytes, payload_crc;
} slot_header;

uint32_t ub_crc32(uint32_t crc, const void *data, uint32_t n) {
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* The header is serialized little-endian, whatever the device's byte order. */
static void put32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); b[2] = (uint8_t)(v >> 16); b[3] = (uint8_t)(v >> 24);
}
static uint32_t get32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void encode(uint8_t out[UB_CHECKPOINT_HEADER_BYTES], const slot_header *h) {
    const uint32_t words[7] = {UB_CHECKPOINT_MAGIC, UB_CHECKPOINT_VERSION, h->model_id,
                               h->sequence, h->payload_bytes, h->payload_crc, 0u};
    for (int i = 0; i < 7; ++i) put32(out + 4 * i, words[i]);
    put32(out + 28, ub_crc32(0, out, 28));
}

/* The payload's CRC, read through a small stack buffer (no allocation). */
static int32_t payload_crc(const ub_storage *s, uint32_t block, uint32_t n, uint32_t *crc) {
    uint8_t chunk[256];
    uint32_t c = 0;
    for (uint32_t done = 0; done < n;) {
        const uint32_t k = n - done < sizeof chunk ? n - done : (uint32_t)sizeof chunk;
        if (s->read(s->user, block, UB_CHECKPOINT_HEADER_BYTES + done, chunk, k) != UB_OK)
            return UB_ERR_STORAGE;
        c = ub_crc32(c, chunk, k);
        done += k;
    }
    *crc = c;
    return UB_OK;
}

/* UB_OK when `block` holds a complete checkpoint of this model and size. */
static int32_t read_slot(const ub_storage *s, uint32_t block, uint32_t model_id, uint32_t n,
                         slot_header *h) {
    uint8_t raw[UB_CHECKPOINT_HEADER_BYTES];
    if (s->read(s->user, block, 0, raw, sizeof raw) != UB_OK) return UB_ERR_NO_CHECKPOINT;
    if (get32(raw) != UB_CHECKPOINT_MAGIC || get32(raw + 4) != UB_CHECKPOINT_VERSION ||
        get32(raw + 28) != ub_crc32(0, raw, 28))
        return UB_ERR_NO_CHECKPOINT;
    h->model_id = get32(raw + 8);
    h->sequence = get32(raw + 12);
    h->payload_bytes = get32(raw + 16);
    h->payload_crc = get32(raw + 20);
    if (h->model_id != model_id || h->payload_bytes != n) return UB_ERR_CHECKPOINT_MISMATCH;
    uint32_t crc;
    if (payload_crc(s, block, n, &crc) != UB_OK || crc != h->payload_crc)
        return UB_ERR_NO_CHECKPOINT;
    return UB_OK;
}

/* The slot holding the newest valid checkpoint, or -1. Sequence numbers compare modulo 2^32. */
static int newest(const ub_storage *s, uint32_t model_id, uint32_t n, slot_header h[2],
                  int32_t status[2]) {
    for (uint32_t b = 0; b < 2; ++b) status[b] = read_slot(s, b, model_id, n, &h[b]);
    if (status[0] == UB_OK && status[1] == UB_OK)
        return (int32_t)(h[1].sequence - h[0].sequence) > 0 ? 1 : 0;
    if (status[0] == UB_OK) return 0;
    if (status[1] == UB_OK) return 1;
    return -1;
}

static uint32_t total_bytes(const ub_segment *segments, uint32_t count, int *ok) {
    uint32_t n = 0;
    *ok = segments != NULL || count == 0;
    for (uint32_t i = 0; *ok && i < count; ++i) {
        *ok = (segments[i].data != NULL || segments[i].bytes == 0) &&
              n + segments[i].bytes >= n;
        n += segments[i].bytes;
    }
    return n;
}

static int valid_storage(const ub_storage *s, uint32_t n) {
    return s->read != NULL && s->write != NULL && s->block_bytes >= UB_CHECKPOINT_HEADER_BYTES &&
           n <= s->block_bytes - UB_CHECKPOINT_HEADER_BYTES;
}

int32_t ub_checkpoint_save(const ub_storage *storage, uint32_t model_id,
                           const ub_segment *segments, uint32_t count) {
    int ok;
    const uint32_t n = total_bytes(segments, count, &ok);
    if (storage == NULL || !ok) return UB_ERR_NULL_ARGUMENT;
    if (!valid_storage(storage, n)) return UB_ERR_SIZE;
    slot_header h[2];
    int32_t status[2];
    const int current = newest(storage, model_id, n, h, status);
    const uint32_t target = current == 0 ? 1u : 0u;
    slot_header next = {model_id, current < 0 ? 1u : h[current].sequence + 1u, n, 0u};
    for (uint32_t i = 0; i < count; ++i)
        next.payload_crc = ub_crc32(next.payload_crc, segments[i].data, segments[i].bytes);
    uint8_t raw[UB_CHECKPOINT_HEADER_BYTES] = {0};
    /* Invalidate, write the payload, then commit with the header. */
    if (storage->write(storage->user, target, 0, raw, sizeof raw) != UB_OK) return UB_ERR_STORAGE;
    uint32_t at = UB_CHECKPOINT_HEADER_BYTES;
    for (uint32_t i = 0; i < count; at += segments[i].bytes, ++i)
        if (storage->write(storage->user, target, at, segments[i].data, segments[i].bytes) != UB_OK)
            return UB_ERR_STORAGE;
    encode(raw, &next);
    if (storage->write(storage->user, target, 0, raw, sizeof raw) != UB_OK) return UB_ERR_STORAGE;
    return UB_OK;
}

int32_t ub_checkpoint_restore(const ub_storage *storage, uint32_t model_id,
                              const ub_segment *segments, uint32_t count, uint32_t *sequence) {
    int ok;
    const uint32_t n = total_bytes(segments, count, &ok);
    if (storage == NULL || !ok) return UB_ERR_NULL_ARGUMENT;
    if (!valid_storage(storage, n)) return UB_ERR_SIZE;
    slot_header h[2];
    int32_t status[2];
    const int slot = newest(storage, model_id, n, h, status);
    if (slot < 0)
        return (status[0] == UB_ERR_CHECKPOINT_MISMATCH || status[1] == UB_ERR_CHECKPOINT_MISMATCH)
                   ? UB_ERR_CHECKPOINT_MISMATCH
                   : UB_ERR_NO_CHECKPOINT;
    /* Verified above; a storage error during this copy is reported (segments may be partial). */
    uint32_t at = UB_CHECKPOINT_HEADER_BYTES, crc = 0;
    for (uint32_t i = 0; i < count; at += segments[i].bytes, ++i) {
        if (storage->read(storage->user, (uint32_t)slot, at, segments[i].data,
                          segments[i].bytes) != UB_OK)
            return UB_ERR_STORAGE;
        crc = ub_crc32(crc, segments[i].data, segments[i].bytes);
    }
    if (crc != h[slot].payload_crc) return UB_ERR_STORAGE;
    if (sequence != NULL) *sequence = h[slot].sequence;
    return UB_OK;
}
