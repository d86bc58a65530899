/* ubitrain runtime: the offload interface between the CPU part and the DSP part of a step.
 *
 * Shaped like Qualcomm's FastRPC: a session is opened once (`open` is the transport's own
 * function, e.g. ub_offload_pipe_open), then each step submits methods of the remote side (and waits for them)
 * with a list of buffers, then the session is closed. A buffer is copied to the remote side
 * before the method runs when it has UB_OFFLOAD_IN, and back after it when it has
 * UB_OFFLOAD_OUT (a shared-memory transport, like FastRPC with ION buffers, may map instead
 * of copying). The remote side has its graph prepared once (its kernels and the arena offsets
 * of every buffer are compiled in); a method is one segment of the step. Any transport that
 * fills in `submit`, `wait` and `close` can be dropped in. No malloc. */
#ifndef UB_OFFLOAD_H
#define UB_OFFLOAD_H

#include <stdint.h>

#include "ub_status.h"

#define UB_OFFLOAD_IN 1u
#define UB_OFFLOAD_OUT 2u

typedef struct {
    void *data;
    uint32_t bytes;
    uint32_t flags;  /* UB_OFFLOAD_IN | UB_OFFLOAD_OUT */
} ub_offload_buffer;

/* Asynchronous: `submit` starts a method and returns; `wait` (same method and buffers)
 * blocks until it is done and its OUT buffers are back. One method at a time per session.
 * Until the wait, the caller must not write any of the buffers nor read an OUT one (a
 * transport may map them instead of copying). */
typedef struct ub_offload {
    void *transport;  /* the transport's own state */
    int32_t (*submit)(void *transport, uint32_t method, const ub_offload_buffer *buffers,
                      uint32_t count);
    int32_t (*wait)(void *transport, uint32_t method, const ub_offload_buffer *buffers,
                    uint32_t count);
    int32_t (*close)(void *transport);
} ub_offload;

static inline int32_t ub_offload_submit(const ub_offload *h, uint32_t method,
                                        const ub_offload_buffer *buffers, uint32_t count) {
    if (h == 0 || h->submit == 0) return UB_ERR_NULL_ARGUMENT;
    return h->submit(h->transport, method, buffers, count);
}

static inline int32_t ub_offload_wait(const ub_offload *h, uint32_t method,
                                      const ub_offload_buffer *buffers, uint32_t count) {
    if (h == 0 || h->wait == 0) return UB_ERR_NULL_ARGUMENT;
    return h->wait(h->transport, method, buffers, count);
}

/* submit, then wait */
static inline int32_t ub_offload_invoke(const ub_offload *h, uint32_t method,
                                        const ub_offload_buffer *buffers, uint32_t count) {
    const int32_t status = ub_offload_submit(h, method, buffers, count);
    return status != UB_OK ? status : ub_offload_wait(h, method, buffers, count);
}

static inline int32_t ub_offload_close(ub_offload *h) {
    if (h == 0 || h->close == 0) return UB_ERR_NULL_ARGUMENT;
    return h->close(h->transport);
}

#endif
