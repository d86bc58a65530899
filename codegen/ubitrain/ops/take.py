"""Gathering along an axis by constant indices (`x[:, idx]`, `index_select`) as a fused op
(training/fused_ops.py), with PyTorch's gradient: a scatter-add in which repeated indices sum.

`take(x, idx)` reads `x` as [outer, N, inner] and the flat indices [K], and gives
[outer, K, inner]; the frontend reshapes around it (views, no copies), so both kernels have
one shape whatever the axis. The backward is `take_backward(dy, idx)` into [outer, N, inner]
(lowering/take_kernels.py). Relax's own `take` gradient legalizes to a kernel that does not
print as C, as for Embedding (training/embedding.py).
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

FORWARD = "take"


def take(bb, x, indices):
    """Emit x [outer, N, inner] gathered at the flat `indices` [K] along axis 1."""
    outer, _, inner = (int(d) for d in x.ty.shape)
    (k,) = (int(d) for d in indices.ty.shape)
    return bb.emit(fused_call(FORWARD, [x, indices],
                              relax.TensorType((outer, k, inner), str(x.ty.dtype))))


def take_grad(orig_var, tensors, output_grad, attrs):
    x, indices = tensors  # x only for its shape
    return [fused_call(FORWARD + "_backward", [output_grad, indices], x.ty,
                       size=int(x.ty.shape[1])), None]
