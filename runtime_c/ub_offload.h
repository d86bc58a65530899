/* ubitrain runtime: the offload interface between the CPU part and the DSP part of a step.
 *
 * Shaped like Qualcomm's FastRPC: a session is opened once (`open` is the transport's own
 * function, e.g. ub_offload_pipe_open), then each step invokes methods of the remote side
 * with a list of buffers, then the session is closed. A buffer is copied to the remote side
 * before the method runs when it has UB_OFFLOAD_IN, and back after it when it has
 * UB_OFFLOAD_OUT (a shared-memory transport, like FastRPC with ION buffers, may map instead
 * of copying). The remote side has its graph prepared once (its kernels and the arena offsets
 * of every buffer are compiled in); a method is one segment of the step. Any transport that
 * fills in `invoke` and `close` can be dropped in. No malloc. */
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

typedef struct ub_offload {
    void *transport;  /* the transport's own state */
    int32_t (*invoke)(void *transport, uint32_t method, const ub_offload_buffer *buffers,
                      uint32_t count);
    int32_t (*close)(void *transport);
} ub_offload;

static inline int32_t ub_offload_invoke(const ub_offload *h, uint32_t method,
                                        const ub_offload_buffer *buffers, uint32_t count) {
    if (h == 0 || h->invoke == 0) return UB_ERR_NULL_ARGUMENT;
    return h->invoke(h->transport, method, buffers, count);
}

static inline int32_t ub_offload_close(ub_offload *h) {
    if (h == 0 || h->close == 0) return UB_ERR_NULL_ARGUMENT;
    return h->close(h->transport);
}

#endif
