"""Kernels of the fused embedding (training/embedding.py): a row gather and its scatter-add.

`ids` is flat ([N] int64 or int32), `weight` is [V, D], `rows` and `dy` are [N, D]. The step
function checks every id against [0, V) before any kernel runs (UB_ERR_INDEX_RANGE), as it
checks class labels, so neither kernel tests an id again.

The backward is a scatter: dW zeroed, then dy row n added into row ids[n] for n = 0..N-1, in
the weight's dtype. That is PyTorch's CPU order (`embedding_dense_backward_cpu`), so repeated
ids sum as PyTorch sums them. A gather (each table row looking for its ids) would cost
V * N * D; the scatter costs V * D + N * D, which is what matters for a real vocabulary.
Rows of `padding_idx` get no gradient, as in PyTorch. With `scale_grad_by_freq` each row n
is scaled by 1 / (the count of ids[n] in the batch) first, as PyTorch scales it.
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


def embedding(weight, ids, padding_idx: int, scale_grad_by_freq: bool, acc: str):
    """The rows; the other attributes matter only to the gradient."""
    (n,), dim = ids.shape, weight.shape[1]
    return te.compute((n, dim), lambda i, j: weight[ids[i], j], name="embedding")


def embedding_id_scales(ids, acc: str):
    """1 / (how often ids[i] occurs among the ids), for `scale_grad_by_freq`: PyTorch's
    `1.0 / counts[k]`, rounded once to float as its `add_(grad[i], scale)` rounds it."""
    (n,) = ids.shape
    m = te.reduce_axis((0, n), name="m")
    counts = te.compute((n,), lambda i: te.sum(
        tirx.if_then_else(ids[m] == ids[i], tirx.const(1, "int32"), tirx.const(0, "int32")),
        axis=m), name="id_counts")
    return te.compute((n,), lambda i: tirx.const(1, "float32") / counts[i].astype("float32"),
                      name="id_scales")


def embedding_backward(dy, ids, *scales, num_embeddings: int, padding_idx: int, acc: str):
    """dW; with `scales` ([N], embedding_id_scales) each dy row n is added times scales[n]."""
    n, dim = (int(d) for d in dy.shape)

    def add_row(dw, dy_buf, row, i, scale):
        with T.serial(dim) as j:
            term = dy_buf[i, j] if scale is None else dy_buf[i, j] * scale[i]
            T.buffer_store(dw, dw[row, j] + term, [row, j])

    def scatter(ins, outs):
        dy_buf, ids_buf, *scale = ins
        scale = scale[0] if scale else None
        (dw,) = outs
        with IRBuilder() as ib:
            with T.seq_scope():
                with T.serial(num_embeddings) as v:
                    with T.serial(dim) as j:
                        T.buffer_store(dw, tirx.const(0, dw.dtype), [v, j])
                with T.serial(n) as i:
                    row = ids_buf[i]
                    if padding_idx < 0:
                        add_row(dw, dy_buf, row, i, scale)
                    else:
                        with T.If(row != tirx.const(padding_idx, ids_buf.dtype)):
                            with T.Then():
                                add_row(dw, dy_buf, row, i, scale)
        return ib.get()

    # buffers declared here have no symbolic element offset, which the C printer would need
    tensors = [dy, ids, *scales]
    ins = [tirx.decl_buffer(t.shape, t.dtype, name)
           for t, name in zip(tensors, ["dy", "ids", "scale"])]
    out = tirx.decl_buffer((num_embeddings, dim), dy.dtype, "dw")
    return te.extern([(num_embeddings, dim)], tensors, scatter, in_buffers=ins,
                     out_buffers=[out], dtype=dy.dtype, name="embedding_backward")


def legalize_embedding_backward(bb, dy, ids, *, num_embeddings: int, padding_idx: int,
                                scale_grad_by_freq: bool = False, acc: str):
    """The scatter, after the per-id scales when the gradient is scaled by frequency."""
    scales = [bb.emit(bb.call_te(embedding_id_scales, ids, acc=acc,
                                 primfunc_name_hint="embedding_id_scales"))
              ] if scale_grad_by_freq else []
    return bb.call_te(embedding_backward, dy, ids, *scales, num_embeddings=num_embeddings,
                      padding_idx=padding_idx, acc=acc,
                      primfunc_name_hint="embedding_backward")
