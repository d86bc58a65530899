"""Kernels of the fused take (training/take.py): a gather along axis 1 and its scatter-add.

`x` and `dx` are [outer, N, inner], `y` and `dy` are [outer, K, inner], `idx` is [K] int32,
every value in [0, N): the indices are constants that the frontend checked and made
non-negative, so neither kernel tests them.

The backward zeroes dx, then adds dy[o, k, :] into dx[o, idx[k], :] for k = 0..K-1 in
order: per element of dx the terms sum in ascending k, the order of PyTorch's CPU backward
(`index_add_` for index_select, `index_put_(accumulate=True)` for `x[:, idx]`).
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


def take(x, idx, acc: str):
    outer, _, inner = x.shape
    (k,) = idx.shape
    return te.compute((outer, k, inner), lambda o, i, j: x[o, idx[i], j], name="take")


def take_backward(dy, idx, *, size: int, acc: str):
    outer, k, inner = (int(d) for d in dy.shape)

    def scatter(ins, outs):
        dy_buf, idx_buf = ins
        (dx,) = outs
        with IRBuilder() as ib:
            with T.seq_scope():
                with T.serial(outer) as o:
                    with T.serial(size) as n:
                        with T.serial(inner) as j:
                            T.buffer_store(dx, tirx.const(0, dx.dtype), [o, n, j])
                with T.serial(outer) as o:
                    with T.serial(k) as i:
                        with T.serial(inner) as j:
                            row = idx_buf[i]
                            T.buffer_store(dx, dx[o, row, j] + dy_buf[o, i, j], [o, row, j])
        return ib.get()

    # buffers declared here have no symbolic element offset, which the C printer would need
    ins = [tirx.decl_buffer(t.shape, t.dtype, name) for t, name in ((dy, "dy"), (idx, "idx"))]
    out = tirx.decl_buffer((outer, size, inner), dy.dtype, "dx")
    return te.extern([(outer, size, inner)], [dy, idx], scatter, in_buffers=ins,
                     out_buffers=[out], dtype=dy.dtype, name="take_backward")
