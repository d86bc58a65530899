"""The kernel of the fused attention mask (ops/attention_mask.py): per row of a bool mask
[..., K], keep = 1 if any element is True, else 0; additive = 0 where the mask is True or
the row is dead, -inf elsewhere."""

from __future__ import annotations

from tvm import te, tirx


def attention_mask(mask, dtype: str, acc: str):
    shape = [int(d) for d in mask.shape]
    rows, keys = shape[:-1], shape[-1]
    k = te.reduce_axis((0, keys), name="k")
    count = te.compute(rows + [1], lambda *r: te.sum(
        mask(*r[:-1], k).astype("int32"), axis=k), name="attend_count")
    zero, one = tirx.const(0.0, dtype), tirx.const(1.0, dtype)
    keep = te.compute(rows + [1], lambda *r: tirx.Select(count(*r) > 0, one, zero),
                      name="keep")
    additive = te.compute(shape, lambda *i: tirx.Select(
        tirx.Or(mask(*i), count(*i[:-1], 0) == 0), zero, tirx.const(float("-inf"), dtype)),
        name="additive")
    return additive, keep
