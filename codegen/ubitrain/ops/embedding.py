"""Embedding as a fused op (training/fused_ops.py): PyTorch's gradient, padding row included.

`embedding(weight, ids)` gathers rows of `weight` [V, D] by the flat ids [N]. Relax's own
`take` would do the forward, but its gradient cannot leave the `padding_idx` row at zero and
TVM's kernel for it (`take_backward`) does not print as C; the backward here is
`embedding_backward(dy, ids)`, a scatter-add (lowering/embedding_kernels.py).
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

FORWARD = "embedding"


def embedding(bb, weight, ids, padding_idx: int, scale_grad_by_freq: bool = False):
    """Emit the rows [N, D] of `weight` at the flat `ids`; `padding_idx` < 0 means none."""
    n, dim = int(ids.ty.shape[0]), int(weight.ty.shape[1])
    out_ty = relax.TensorType((n, dim), str(weight.ty.dtype))
    return bb.emit(fused_call(FORWARD, [weight, ids], out_ty, padding_idx=padding_idx,
                              scale_grad_by_freq=scale_grad_by_freq))


def embedding_grad(orig_var, tensors, output_grad, attrs):
    weight, ids = tensors  # the weight only for its shape: the backward never reads it
    num = int(weight.ty.shape[0])
    return [fused_call(FORWARD + "_backward", [output_grad, ids], weight.ty,
                       num_embeddings=num, **attrs), None]
