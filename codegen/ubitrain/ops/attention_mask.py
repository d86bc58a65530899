"""A boolean attention mask computed in the step (a padding mask from a model input), made
additive as PyTorch's scaled_dot_product_attention makes it: one fused op
(training/fused_ops.py) with no gradient, so that Relax's Gradient pass stops at it instead
of differentiating the mask's ops (a comparison, a row reduction) that have no rule.

`attention_mask(mask)` gives (additive, keep): additive is 0 where the mask is True and -inf
elsewhere, and 0 throughout a row that attends to nothing, whose keep is 0 (1 for every
other row): the softmax of such a row times keep is zeros, as PyTorch's `_safe_softmax`
gives, and no NaN enters the backward (lowering/attention_mask_kernels.py).
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

FORWARD = "attention_mask"


def attention_mask(bb, mask, dtype: str):
    """Emit the fused op on a bool `mask` [..., keys]; return (additive, keep) as vars."""
    shape = [int(d) for d in mask.ty.shape]
    out = bb.emit(fused_call(FORWARD, [mask], [relax.TensorType(shape, dtype),
                                               relax.TensorType(shape[:-1] + [1], dtype)],
                             dtype=dtype))
    return bb.emit(relax.TupleGetItem(out, 0)), bb.emit(relax.TupleGetItem(out, 1))


def attention_mask_grad(orig_var, tensors, output_grad, attrs):
    return [None]  # a mask: no gradient
