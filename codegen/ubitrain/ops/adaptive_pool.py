"""Adaptive pooling of any output size as fused ops (training/fused_ops.py), PyTorch's
semantics.

Output row i of an adaptive pool reads input rows [floor(i * H / OH), ceil((i + 1) * H / OH)),
likewise for columns: windows of uneven sizes that overlap where OH does not divide H (and
repeat rows where OH > H). Relax has no op for that with a gradient (nor any adaptive max
pool), so each is one fused op with its own kernels (lowering/adaptive_pool_kernels.py):

- `adaptive_avg_pool2d(x)`, backward `adaptive_avg_pool2d_backward(dy)`: each window's dy
  divided by its own size, gathered by every input element from the windows that hold it.
- `adaptive_max_pool2d(x)`, backward `adaptive_max_pool2d_backward(dy, x)`: each window's dy
  goes to its first maximum in scan order (PyTorch's rule, as for max_pool2d), found again
  from x, so the backward keeps x alive and no index tensor.

The frontend uses these only where the windows are uneven; a pool whose input size is a
multiple of its output size is a plain avg_pool2d / max_pool2d.
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

AVG, MAX = "adaptive_avg_pool2d", "adaptive_max_pool2d"


def adaptive_pool2d(bb, x, out_size, mode: str):
    """Emit the fused adaptive pool (`mode` "avg" or "max") of NCHW x to `out_size` (OH, OW)."""
    n, c = (int(d) for d in list(x.ty.shape)[:2])
    out_ty = relax.TensorType((n, c, *out_size), str(x.ty.dtype))
    op = AVG if mode == "avg" else MAX
    return bb.emit(fused_call(op, [x], out_ty, out=[int(d) for d in out_size]))


def adaptive_avg_pool2d_grad(orig_var, tensors, output_grad, attrs):
    (x,) = tensors  # only x's shape: x itself need not live until the backward
    in_size = [int(d) for d in list(x.ty.shape)[2:]]
    return [fused_call(AVG + "_backward", [output_grad], x.ty, in_size=in_size)]


def adaptive_max_pool2d_grad(orig_var, tensors, output_grad, attrs):
    (x,) = tensors
    return [fused_call(MAX + "_backward", [output_grad, x], x.ty)]
