"""Gradient rules that ubitrain registers with Relax's Gradient pass.

`GRADIENT_RULES` is a table `{relax op: rule}`. It fills the gaps of TVM 0.27 (`relax.clip`,
`relax.erf`, `relax.strided_slice`, `relax.flip`, `relax.nn.leakyrelu`) and replaces rules whose
tie-breaking differs from PyTorch: PyTorch gives ReLU zero gradient at exactly 0 and
Hardtanh/ReLU6 zero gradient at both bounds, which matters because ReLU outputs feed exact
zeros into later activations; `abs` has zero gradient at 0 in PyTorch, TVM's passes dy.

It replaces TVM's `relax.variance` rule, which cancels catastrophically (see
`variance_grad`), and its `relax.nn.conv2d` rule, which sizes the input gradient with the
undilated kernel: every dilated convolution failed to compile (Conv2dTranspose rejects the
output padding it computes). `LEGALIZE_OVERRIDES` replaces TOPI's kernels for the pooling
gradients (see `pool_grad.py`): the avg_pool2d one divides by another window size than the
forward in ceil mode, the max_pool2d one does not legalize dilation. Those are
legalizations because the Gradient pass's output keeps TVM's `relax.grad.*` ops.
"""

import math

import tvm
from tvm import relax
from tvm.relax import op as R
from tvm.relax.op.base import register_gradient
from tvm.relax.op.grad import no_grad

from . import (
    adaptive_pool,
    attention_mask,
    batch_norm,
    elu,
    embedding,
    layer_norm,
    softmax_cross_entropy,
    table_activation,
    take,
)
from .fused_ops import fused_gradient
from .pool_grad import avg_pool2d_backward, max_pool2d_backward
from .tagging import tag

# Above TVM's own level (10), so these rules take precedence where TVM has one.
OVERRIDE_LEVEL = 30


def _zero(x):
    return relax.const(0.0, str(x.ty.dtype))


def relu_grad(orig_var, orig_call, output_grad, ctx):
    # From the output: relu(x) > 0 exactly where x > 0 (NaN in both is not > 0), and the
    # output is kept anyway as the next layer's input, so the input can die in the forward
    # pass (and the ReLU run in place over it).
    y = orig_var
    return [R.where(R.greater(y, _zero(y)), output_grad, _zero(y))]


def leakyrelu_grad(orig_var, orig_call, output_grad, ctx):
    # TVM 0.27 has no rule. PyTorch's: x > 0 ? dy : dy * slope (the slope at exactly 0).
    # With a slope >= 0, y > 0 exactly where x > 0, so it is read from y as for ReLU; a
    # negative slope makes y > 0 for x < 0 too, and then only x can tell.
    slope = float(orig_call.attrs.alpha)
    x = orig_var if slope >= 0 else orig_call.args[0]
    scaled = R.multiply(output_grad, relax.const(slope, str(x.ty.dtype)))
    return [R.where(R.greater(x, _zero(x)), output_grad, scaled)]


def clip_grad(orig_var, orig_call, output_grad, ctx):
    _, lo, hi = orig_call.args
    y = orig_var  # clip(x) lies strictly inside (lo, hi) exactly where x does, as for ReLU
    dtype = str(y.ty.dtype)
    # The bounds are FloatImm arguments, not tensors: they take `no_grad` (a None here makes
    # the Gradient pass crash).
    inside = R.logical_and(R.greater(y, relax.const(float(lo.value), dtype)),
                           R.less(y, relax.const(float(hi.value), dtype)))
    return [R.where(inside, output_grad, _zero(y)), no_grad(lo), no_grad(hi)]


def abs_grad(orig_var, orig_call, output_grad, ctx):
    # PyTorch's: dy * sgn(x), 0 at x == 0 (TVM's rule passes dy there).
    x = orig_call.args[0]
    return [R.where(R.greater(x, _zero(x)), output_grad,
                    R.where(R.less(x, _zero(x)), R.negative(output_grad), _zero(x)))]


def erf_grad(orig_var, orig_call, output_grad, ctx):
    x = orig_call.args[0]
    dtype = str(x.ty.dtype)
    slope = R.multiply(R.exp(R.negative(R.multiply(x, x))),
                       relax.const(2 / math.sqrt(math.pi), dtype))
    return [R.multiply(output_grad, slope)]


def gelu_grad(orig_var, orig_call, output_grad, ctx):
    """PyTorch's exact GELU gradient, dy * (Phi(x) + x * phi(x)), from x alone."""
    x = orig_call.args[0]
    dtype = str(x.ty.dtype)
    cdf = R.multiply(R.add(R.erf(R.multiply(x, relax.const(math.sqrt(0.5), dtype))),
                           relax.const(1.0, dtype)), relax.const(0.5, dtype))
    pdf = R.multiply(R.exp(R.multiply(R.multiply(x, x), relax.const(-0.5, dtype))),
                     relax.const(1 / math.sqrt(2 * math.pi), dtype))
    return [R.multiply(output_grad, R.add(cdf, R.multiply(x, pdf)))]


def gelu_tanh_grad(orig_var, orig_call, output_grad, ctx):
    """PyTorch's tanh-approximate GELU gradient, from x alone: with
    t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi)
    (1 + 3 * 0.044715 x^2)."""
    x = orig_call.args[0]
    dtype = str(x.ty.dtype)

    def c(v):
        return relax.const(v, dtype)

    beta, kappa = math.sqrt(2 / math.pi), 0.044715
    x_sq = R.multiply(x, x)
    t = R.tanh(R.multiply(R.add(x, R.multiply(R.multiply(x_sq, x), c(kappa))), c(beta)))
    left = R.multiply(R.add(t, c(1.0)), c(0.5))
    slope = R.multiply(R.add(R.multiply(x_sq, c(3 * kappa)), c(1.0)), c(beta))
    right = R.multiply(R.multiply(R.multiply(x, c(0.5)), R.subtract(c(1.0), R.multiply(t, t))),
                       slope)
    return [R.multiply(output_grad, R.add(left, right))]


def variance_grad(orig_var, orig_call, output_grad, ctx):
    """d var / dx = 2/n (x - mean). TVM's rule, 2/n x - 2/n^2 sum(x), cancels catastrophically
    when a channel's mean is large against its spread (BatchNorm after a saturated ReLU6)."""
    x = orig_call.args[0]
    axis, keepdims = orig_call.attrs.axis, orig_call.attrs.keepdims
    shape = [int(d) for d in x.ty.shape]
    axes = [int(a) % len(shape) for a in axis] if axis else list(range(len(shape)))
    count = math.prod(shape[a] for a in axes)
    centered = R.subtract(x, R.mean(x, axis=axes, keepdims=True))
    if not keepdims:
        output_grad = R.expand_dims(output_grad, axes)
    return [R.multiply(output_grad, R.multiply(centered, relax.const(2.0 / count,
                                                                     str(x.ty.dtype))))]


def _ints(values):
    return [int(v) for v in values]


def conv2d_grad(orig_var, orig_call, output_grad, ctx):
    """Gradients of an NCHW/OIHW conv2d w.r.t. its input and its weight.

    The input gradient is the transposed convolution of the output gradient; its output
    padding gives back the rows and columns that no window reached, the remainder of
    `H + 2p - dilated kernel` divided by the stride. TVM 0.27's rule used the undilated
    kernel there. The weight gradient is the correlation of the input with the output
    gradient (strides and dilation swap roles), with the groups moved into the batch.
    """
    attrs = orig_call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        raise ValueError("ubitrain's conv2d gradient needs NCHW data and OIHW weights")
    data, weight = orig_call.args
    batch, _, grad_h, grad_w = _ints(orig_var.ty.shape)
    _, in_channels, in_h, in_w = _ints(data.ty.shape)
    _, _, kh, kw = _ints(weight.ty.shape)
    pad_top, pad_left, pad_bottom, pad_right = _ints(attrs.padding)
    stride_h, stride_w = _ints(attrs.strides)
    dil_h, dil_w = _ints(attrs.dilation)
    groups = int(attrs.groups)

    reached_h = (grad_h - 1) * stride_h - pad_top - pad_bottom + dil_h * (kh - 1) + 1
    reached_w = (grad_w - 1) * stride_w - pad_left - pad_right + dil_w * (kw - 1) + 1
    data_grad = R.nn.conv2d_transpose(
        output_grad, weight, strides=(stride_h, stride_w), padding=_ints(attrs.padding),
        output_padding=(in_h - reached_h, in_w - reached_w), dilation=(dil_h, dil_w),
        groups=groups, data_layout="NCHW", kernel_layout="IOHW", out_layout="NCHW",
        out_dtype=attrs.out_dtype)

    # Correlating the whole padded input would also give dW rows and columns for windows that
    # start past the last kernel tap (a stride-2 3x3 conv over an even size: 4x4). Those rows
    # come off the bottom/right padding, or off the input where the padding is thinner.
    full_h = (in_h + pad_top + pad_bottom - (grad_h - 1) * stride_h - 1) // dil_h + 1
    full_w = (in_w + pad_left + pad_right - (grad_w - 1) * stride_w - 1) // dil_w + 1
    extra_h, extra_w = (full_h - kh) * dil_h, (full_w - kw) * dil_w
    unpad_h, unpad_w = min(extra_h, pad_bottom), min(extra_w, pad_right)
    if extra_h > unpad_h or extra_w > unpad_w:
        in_h, in_w = in_h - (extra_h - unpad_h), in_w - (extra_w - unpad_w)
        if in_h <= 0 or in_w <= 0:  # every tap reads padding only (a 1x1 kernel, padding 1,
            return [data_grad, R.zeros_like(weight)]  # stride past the input): dW = 0
        data = R.strided_slice(data, axes=[2, 3], begin=[0, 0], end=[in_h, in_w])
    padding = [pad_top, pad_left, pad_bottom - unpad_h, pad_right - unpad_w]
    if groups != 1:
        data = R.reshape(data, (batch, groups, in_channels // groups, in_h, in_w))
        data = R.permute_dims(data, [1, 0, 2, 3, 4])
        data = R.reshape(data, (groups * batch, in_channels // groups, in_h, in_w))
    # [groups * batch, C/g, H, W] read as CNHW: channel = (group, sample), batch = C/g.
    weight_grad = R.nn.conv2d(
        data, output_grad, strides=(dil_h, dil_w), padding=padding,
        dilation=(stride_h, stride_w), groups=groups, data_layout="CNHW",
        kernel_layout="IOHW", out_layout="CNHW", out_dtype=attrs.out_dtype)
    return [data_grad, weight_grad]


def strided_slice_grad(orig_var, orig_call, output_grad, ctx):
    """The slice's gradient back where the slice came from, zeros elsewhere (TVM 0.27 has
    no rule). Along each sliced axis of length L that kept n elements from `begin` on in
    steps of s: a step s > 1 first spaces the n values s apart (a unit axis padded to s,
    merged back: n * s values, a value every s-th) and drops the trailing zeros that would
    pass L; then zeros pad the axis to L, `begin` of them in front."""
    x, axes, begin, _, *strides = orig_call.args
    in_shape, grad = _ints(x.ty.shape), output_grad
    shape = _ints(orig_var.ty.shape)
    steps = [int(s) for s in strides[0].fields] if strides else [1] * len(axes.fields)
    for axis, start, step in zip(axes.fields, begin.fields, steps):
        axis = int(axis) % len(shape)
        start, length, n = int(start), in_shape[axis], shape[axis]
        if step > 1:
            unit = shape[:axis + 1] + [1] + shape[axis + 1:]
            widths = [0] * (2 * len(unit))
            widths[2 * axis + 3] = step - 1
            shape[axis] = min(n * step, length - start)
            spaced = R.reshape(R.nn.pad(R.reshape(grad, unit), widths),
                               shape[:axis] + [n * step] + shape[axis + 1:])
            grad = (spaced if shape[axis] == n * step else
                    R.strided_slice(spaced, axes=[axis], begin=[0], end=[shape[axis]]))
        widths = [0] * (2 * len(shape))
        widths[2 * axis], widths[2 * axis + 1] = start, length - start - shape[axis]
        grad = R.nn.pad(grad, widths)
        shape[axis] = length
    return [grad] + [no_grad(a) for a in orig_call.args[1:]]


def flip_grad(orig_var, orig_call, output_grad, ctx):
    """A reversal's gradient is the same reversal (TVM 0.27 has no rule)."""
    return [R.flip(output_grad, orig_call.attrs.axis)]


def legalize_avg_pool2d_backward(bb, call):
    """`relax.grad.avg_pool2d_backward` (what TVM's avg_pool2d gradient emits) as
    ubitrain's own kernel instead of TOPI's `pool_grad`."""
    attrs = call.attrs
    output_grad, x = call.args
    if attrs.layout != "NCHW" or any(int(d) != 1 for d in attrs.dilation):
        raise ValueError("ubitrain's avg_pool2d gradient needs NCHW and no dilation")
    return bb.call_te(avg_pool2d_backward, output_grad, in_shape=_ints(x.ty.shape),
                      pool_size=_ints(attrs.pool_size), strides=_ints(attrs.strides),
                      padding=_ints(attrs.padding),
                      count_include_pad=bool(attrs.count_include_pad),
                      primfunc_name_hint="avg_pool2d_backward")


def legalize_max_pool2d_backward(bb, call):
    """`relax.grad.max_pool2d_backward` as ubitrain's kernel: PyTorch's first-maximum
    semantics, and dilation, which TOPI's `pool_grad` does not legalize at all."""
    attrs = call.attrs
    output_grad, x = call.args
    if attrs.layout != "NCHW":
        raise ValueError("ubitrain's max_pool2d gradient needs NCHW")
    geometry = dict(pool_size=_ints(attrs.pool_size), strides=_ints(attrs.strides),
                    padding=_ints(attrs.padding), dilation=_ints(attrs.dilation))
    out = bb.call_te(max_pool2d_backward, output_grad, x, **geometry,
                     primfunc_name_hint="max_pool2d_backward")
    # tagged: targets with micro-kernels run a one-pass scatter instead (microkernels/)
    tag(bb, out, "relax.grad.max_pool2d_backward", geometry, [output_grad, x])
    return out


GRADIENT_RULES = {
    "relax.nn.conv2d": conv2d_grad,
    "relax.nn.relu": relu_grad,
    "relax.nn.leakyrelu": leakyrelu_grad,
    "relax.clip": clip_grad,
    "relax.erf": erf_grad,
    "relax.abs": abs_grad,
    "relax.nn.gelu": gelu_grad,
    "relax.nn.gelu_tanh": gelu_tanh_grad,
    "relax.variance": variance_grad,
    "relax.strided_slice": strided_slice_grad,
    "relax.flip": flip_grad,
    # Fused training ops (training/fused_ops.py), by op name.
    "relax.call_dps_packed": fused_gradient({
        batch_norm.FORWARD: batch_norm.batch_norm_train_grad,
        layer_norm.FORWARD: layer_norm.layer_norm_grad,
        softmax_cross_entropy.FORWARD: softmax_cross_entropy.softmax_cross_entropy_grad,
        adaptive_pool.AVG: adaptive_pool.adaptive_avg_pool2d_grad,
        adaptive_pool.MAX: adaptive_pool.adaptive_max_pool2d_grad,
        elu.FORWARD: elu.elu_grad,
        embedding.FORWARD: embedding.embedding_grad,
        take.FORWARD: take.take_grad,
        table_activation.FORWARD: table_activation.table_activation_grad,
        attention_mask.FORWARD: attention_mask.attention_mask_grad,
    }),
}

# Legalizations of the ops that gradient rules emit, where TOPI's kernel is wrong.
LEGALIZE_OVERRIDES = {
    "relax.grad.avg_pool2d_backward": legalize_avg_pool2d_backward,
    "relax.grad.max_pool2d_backward": legalize_max_pool2d_backward,
}

_registered = False


def register_gradients():
    global _registered
    if _registered:
        return
    for op_name, rule in GRADIENT_RULES.items():
        register_gradient(op_name, rule, level=OVERRIDE_LEVEL)
    for op_name, legalize in LEGALIZE_OVERRIDES.items():
        tvm.ir.register_op_attr(op_name, "FLegalize", legalize, level=OVERRIDE_LEVEL)
    _registered = True
