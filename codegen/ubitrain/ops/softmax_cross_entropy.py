"""Softmax + cross-entropy (mean over the batch, integer labels) as a fused op.

Forward, one kernel: loss = mean_b(log sum_k exp(z[b,k] - max_b) + max_b - z[b, y_b]).
Backward, one kernel: dz = (softmax(z) - onehot(y)) * dloss / batch, with the row max and
sum recomputed from z (two passes over a [batch, classes] row are cheaper than keeping
them), so nothing but the logits and labels lives from the loss to its gradient.
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

FORWARD = "softmax_cross_entropy"
BACKWARD = "softmax_cross_entropy_backward"


def softmax_cross_entropy(logits, labels):
    return fused_call(FORWARD, [logits, labels], relax.TensorType((), str(logits.ty.dtype)))


def softmax_cross_entropy_grad(orig_var, tensors, output_grad, attrs):
    logits, labels = tensors
    return [fused_call(BACKWARD, [logits, labels, output_grad], logits.ty), None]
