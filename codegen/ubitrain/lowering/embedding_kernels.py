"""Kernels of the fused embedding (training/embedding.py): a row gather and its scatter-add.

`ids` is flat ([N] int64 or int32), `weight` is [V, D], `rows` and `dy` are [N, D]. The step
function checks every id against [0, V) before any kernel runs (UB_ERR_INDEX_RANGE), as it
checks class labels, so neither kernel tests an id again.

The backward is a scatter: dW zeroed, then dy row n added into row ids[n] for n = 0..N-1, in
the weight's dtype. That is PyTorch's CPU order (`embedding_dense_backward_cpu`), so repeated
ids sum as PyTorch sums them. A gather (each table row looking for its ids) would cost
V * N * D; the scatter costs V * D + N * D, which is what matters for a real vocabulary.
Rows of `padding_idx` get no gradient, as in PyTorch.
"""

from __future__ import annotations

from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


def embedding(weight, ids, padding_idx: int, acc: str):
    """The rows; `padding_idx` matters only to the gradient."""
    (n,), dim = ids.shape, weight.shape[1]
    return te.compute((n, dim), lambda i, j: weight[ids[i], j], name="embedding")


def embedding_backward(dy, ids, num_embeddings: int, padding_idx: int, acc: str):
    n, dim = (int(d) for d in dy.shape)

    def add_row(dw, dy_buf, row, i):
        with T.serial(dim) as j:
            T.buffer_store(dw, dw[row, j] + dy_buf[i, j], [row, j])

    def scatter(ins, outs):
        dy_buf, ids_buf = ins
        (dw,) = outs
        with IRBuilder() as ib:
            with T.seq_scope():
                with T.serial(num_embeddings) as v:
                    with T.serial(dim) as j:
                        T.buffer_store(dw, tirx.const(0, dw.dtype), [v, j])
                with T.serial(n) as i:
                    row = ids_buf[i]
                    if padding_idx < 0:
                        add_row(dw, dy_buf, row, i)
                    else:
                        with T.If(row != tirx.const(padding_idx, ids_buf.dtype)):
                            with T.Then():
                                add_row(dw, dy_buf, row, i)
        return ib.get()

    # buffers declared here have no symbolic element offset, which the C printer would need
    ins = [tirx.decl_buffer(t.shape, t.dtype, name) for t, name in [(dy, "dy"), (ids, "ids")]]
    out = tirx.decl_buffer((num_embeddings, dim), dy.dtype, "dw")
    return te.extern([(num_embeddings, dim)], [dy, ids], scatter, in_buffers=ins,
                     out_buffers=[out], dtype=dy.dtype, name="embedding_backward")
