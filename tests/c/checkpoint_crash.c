/* Crash consistency and fuzzing of runtime_c/ub_checkpoint.c (built and run by
 * tests/test_checkpoint.py).
 *
 * crash: a RAM storage that loses power after a given number of written bytes (the write in
 * progress keeps only its prefix; later writes fail). For every cut point of a save, a
 * "reboot" must restore the previous checkpoint whole if the save failed, the new one whole
 * if it succeeded, never a mix and never an error; and the next save must work.
 * fuzz: random, truncated and mutated slot images; restore must return a known status and
 * may return UB_OK only with a payload that was really saved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ub_checkpoint.h"
#include "ub_status.h"

#define CAP 4096u
#define PAYLOAD 2000u

typedef struct {
    uint8_t data[2][CAP];
    uint32_t length[2];      /* bytes that exist (reads past them fail) */
    long budget;             /* bytes that may still be written; < 0: unlimited */
} ram_storage;

static int32_t ram_read(void *user, uint32_t block, uint32_t offset, void *dst, uint32_t n) {
    ram_storage *r = (ram_storage *)user;
    if (block > 1 || offset > r->length[block] || n > r->length[block] - offset) return UB_ERR_STORAGE;
    memcpy(dst, r->data[block] + offset, n);
    return UB_OK;
}

static int32_t ram_write(void *user, uint32_t block, uint32_t offset, const void *src, uint32_t n) {
    ram_storage *r = (ram_storage *)user;
    if (block > 1 || offset + n > CAP) return UB_ERR_STORAGE;
    uint32_t k = n;
    if (r->budget >= 0 && (long)n > r->budget) k = (uint32_t)r->budget; /* power lost mid-write */
    memcpy(r->data[block] + offset, src, k);
    if (offset + k > r->length[block]) r->length[block] = offset + k;
    if (r->budget >= 0) r->budget -= k;
    return k == n ? UB_OK : UB_ERR_STORAGE;
}

static ram_storage ram;
static const ub_storage storage = {&ram, CAP, ram_read, ram_write};
static uint8_t payloads[4][PAYLOAD];

static int save(int which) {
    uint8_t meta[8] = {(uint8_t)which, 1, 2, 3, 4, 5, 6, 7};
    ub_segment segs[2] = {{meta, sizeof meta}, {payloads[which], PAYLOAD}};
    return ub_checkpoint_save(&storage, 42u, segs, 2);
}

/* Which payload the storage restores: 0..3, -1 none, -2 a mix or an error. */
static int restored(void) {
    uint8_t meta[8], out[PAYLOAD];
    ub_segment segs[2] = {{meta, sizeof meta}, {out, PAYLOAD}};
    int32_t st = ub_checkpoint_restore(&storage, 42u, segs, 2, NULL);
    if (st == UB_ERR_NO_CHECKPOINT) return -1;
    if (st != UB_OK) return -2;
    int which = meta[0];
    if (which > 3 || memcmp(out, payloads[which], PAYLOAD) != 0) return -2;
    return which;
}

static int crash(void) {
    long cut_points = 0;
    for (int i = 0; i < 4; ++i)
        for (uint32_t j = 0; j < PAYLOAD; ++j) payloads[i][j] = (uint8_t)(rand() >> 7);
    memset(&ram, 0, sizeof ram);
    ram.budget = -1;
    /* The first save ever, cut anywhere: no checkpoint or the new one. */
    for (long cut = 0;; ++cut, ++cut_points) {
        memset(&ram, 0, sizeof ram);
        ram.budget = cut;
        int ok = save(0) == UB_OK;
        ram.budget = -1;
        int got = restored();
        if (got != (ok ? 0 : -1)) { printf("first save, cut %ld: restored %d\n", cut, got); return 1; }
        if (ok) break;
    }
    /* Then saves 1, 2, 3 in turn (alternating slots), each cut at every byte. */
    for (int which = 1; which <= 3; ++which) {
        ram_storage before = ram;
        for (long cut = 0;; ++cut, ++cut_points) {
            ram = before;
            ram.budget = cut;
            int ok = save(which) == UB_OK;
            ram.budget = -1;
            int got = restored();
            if (got != (ok ? which : which - 1)) {
                printf("save %d, cut %ld: saved=%d restored %d\n", which, cut, ok, got);
                return 1;
            }
            if (save(3) != UB_OK || restored() != 3) { /* never loses the ability to save */
                printf("save %d, cut %ld: the next save failed\n", which, cut);
                return 1;
            }
            if (ok) break;
        }
        ram = before;
        ram.budget = -1;
        if (save(which) != UB_OK) return 1;
    }
    printf("crash: %ld cut points\n", cut_points);
    return 0;
}

static int fuzz(long rounds) {
    long ok_count = 0;
    memset(&ram, 0, sizeof ram);
    ram.budget = -1;
    if (save(1) != UB_OK || save(2) != UB_OK) return 1;
    ram_storage good = ram;
    for (long i = 0; i < rounds; ++i) {
        ram = good;
        int mode = rand() % 4;
        for (int b = 0; b < 2; ++b) {
            if (mode == 0) { /* random bytes of random length */
                ram.length[b] = (uint32_t)(rand() % CAP);
                for (uint32_t j = 0; j < ram.length[b]; ++j) ram.data[b][j] = (uint8_t)rand();
            } else if (mode == 1) { /* truncated */
                ram.length[b] = (uint32_t)(rand() % (good.length[b] + 1));
            } else { /* a few flipped bytes, maybe in the header */
                int flips = 1 + rand() % 4;
                for (int f = 0; f < flips; ++f) {
                    uint32_t at = mode == 2 ? (uint32_t)(rand() % 40) : (uint32_t)(rand() % good.length[b]);
                    ram.data[b][at] ^= (uint8_t)(1 + rand() % 255);
                }
            }
        }
        int got = restored();
        if (got == -2) { printf("fuzz round %ld (mode %d): bad status or mixed payload\n", i, mode); return 1; }
        ok_count += got >= 0;
    }
    printf("fuzz: %ld blobs, %ld still restored a saved checkpoint\n", rounds, ok_count);
    return 0;
}

int main(int argc, char **argv) {
    srand(12345);
    if (argc > 1 && strcmp(argv[1], "fuzz") == 0) return fuzz(argc > 2 ? atol(argv[2]) : 100000);
    return crash();
}
