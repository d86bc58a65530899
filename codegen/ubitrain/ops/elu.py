"""ELU as a fused op (training/fused_ops.py), PyTorch's semantics and gradient.

y = x > 0 ? scale * x : alpha * scale * expm1(input_scale * x), and PyTorch's gradient
(elu_backward from x): dx = dy * (x > 0 ? scale : alpha * scale * input_scale *
exp(input_scale * x)), so at exactly 0 the negative side's slope. Relax has no ELU op; a
chain of where/exp for it would differentiate to that rule too, but keeps its intermediates
alive for the backward pass and can only compute expm1 as exp(z) - 1, which loses all
precision for small |z|. One op each way keeps only x.
"""

from __future__ import annotations

from .fused_ops import fused_call

FORWARD = "elu"
BACKWARD = "elu_backward"


def elu(x, alpha: float, scale: float, input_scale: float):
    return fused_call(FORWARD, [x], x.ty, alpha=float(alpha), scale=float(scale),
                      input_scale=float(input_scale))


def elu_grad(orig_var, tensors, output_grad, attrs):
    (x,) = tensors
    return [fused_call(BACKWARD, [x, output_grad], x.ty, **attrs)]
