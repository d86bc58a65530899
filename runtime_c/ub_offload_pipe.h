/* ubitrain runtime: an offload transport over two file descriptors (POSIX read/write), for
 * tests and emulators: the remote side is a process (e.g. the DSP part under qemu-hexagon)
 * reading requests on its stdin and answering on its stdout.
 *
 * Request: u32 method, u32 count, then per buffer u32 bytes, u32 flags and, for IN buffers,
 * the bytes. Reply: i32 status, then the bytes of every OUT buffer in order. Header-only, so
 * that only a program that uses it compiles it (it needs <unistd.h>). */
#ifndef UB_OFFLOAD_PIPE_H
#define UB_OFFLOAD_PIPE_H

#include <stdint.h>
#include <unistd.h>

#include "ub_offload.h"

typedef struct {
    int to_remote;
    int from_remote;
} ub_offload_pipe;

static int32_t ub_offload_pipe_write(int fd, const void *src, uint32_t n) {
    const uint8_t *p = (const uint8_t *)src;
    while (n > 0) {
        const ssize_t put = write(fd, p, n);
        if (put <= 0) return UB_ERR_STORAGE;
        p += put;
        n -= (uint32_t)put;
    }
    return UB_OK;
}

static int32_t ub_offload_pipe_read(int fd, void *dst, uint32_t n) {
    uint8_t *p = (uint8_t *)dst;
    while (n > 0) {
        const ssize_t got = read(fd, p, n);
        if (got <= 0) return UB_ERR_STORAGE;
        p += got;
        n -= (uint32_t)got;
    }
    return UB_OK;
}

/* The request goes out whole (IN buffers copied into the pipe), so the remote side works
 * while the caller goes on; `wait` reads the reply. */
static int32_t ub_offload_pipe_submit(void *transport, uint32_t method,
                                      const ub_offload_buffer *buffers, uint32_t count) {
    const ub_offload_pipe *t = (const ub_offload_pipe *)transport;
    const uint32_t head[2] = {method, count};
    int32_t status = ub_offload_pipe_write(t->to_remote, head, sizeof head);
    for (uint32_t i = 0; status == UB_OK && i < count; ++i) {
        const uint32_t meta[2] = {buffers[i].bytes, buffers[i].flags};
        status = ub_offload_pipe_write(t->to_remote, meta, sizeof meta);
        if (status == UB_OK && (buffers[i].flags & UB_OFFLOAD_IN))
            status = ub_offload_pipe_write(t->to_remote, buffers[i].data, buffers[i].bytes);
    }
    return status;
}

static int32_t ub_offload_pipe_wait(void *transport, uint32_t method,
                                    const ub_offload_buffer *buffers, uint32_t count) {
    const ub_offload_pipe *t = (const ub_offload_pipe *)transport;
    (void)method;
    int32_t remote = 0;
    int32_t status = ub_offload_pipe_read(t->from_remote, &remote, sizeof remote);
    if (status != UB_OK) return status;
    if (remote != UB_OK) return remote;
    for (uint32_t i = 0; status == UB_OK && i < count; ++i)
        if (buffers[i].flags & UB_OFFLOAD_OUT)
            status = ub_offload_pipe_read(t->from_remote, buffers[i].data, buffers[i].bytes);
    return status;
}

static int32_t ub_offload_pipe_close(void *transport) {
    const ub_offload_pipe *t = (const ub_offload_pipe *)transport;
    const uint32_t quit[2] = {0xFFFFFFFFu, 0u};
    return ub_offload_pipe_write(t->to_remote, quit, sizeof quit);
}

/* Open a session on two descriptors: `h` then invokes through `t` (both caller-owned). */
static inline void ub_offload_pipe_open(ub_offload *h, ub_offload_pipe *t, int to_remote,
                                        int from_remote) {
    t->to_remote = to_remote;
    t->from_remote = from_remote;
    h->transport = t;
    h->submit = ub_offload_pipe_submit;
    h->wait = ub_offload_pipe_wait;
    h->close = ub_offload_pipe_close;
}

#endif
