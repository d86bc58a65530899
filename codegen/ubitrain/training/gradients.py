"""Gradient rules that ubitrain registers with Relax's Gradient pass.

`GRADIENT_RULES` is a table `{relax op: rule}`. It fills the gaps of TVM 0.27 (`relax.clip`,
`relax.erf`) and replaces rules whose tie-breaking differs from PyTorch: PyTorch gives ReLU
zero gradient at exactly 0 and Hardtanh/ReLU6 zero gradient at both bounds, which matters
because ReLU outputs feed exact zeros into later activations.
"""

import math

from tvm import relax
from tvm.relax import op as R
from tvm.relax.op.base import register_gradient

# Above TVM's own level (10), so these rules take precedence where TVM has one.
OVERRIDE_LEVEL = 30


def _zero(x):
    return relax.const(0.0, str(x.ty.dtype))


def relu_grad(orig_var, orig_call, output_grad, ctx):
    x = orig_call.args[0]
    return [R.where(R.greater(x, _zero(x)), output_grad, _zero(x))]


def clip_grad(orig_var, orig_call, output_grad, ctx):
    x, lo, hi = orig_call.args
    dtype = str(x.ty.dtype)
    inside = R.logical_and(R.greater(x, relax.const(float(lo.value), dtype)),
                           R.less(x, relax.const(float(hi.value), dtype)))
    return [R.where(inside, output_grad, _zero(x)), None, None]


def erf_grad(orig_var, orig_call, output_grad, ctx):
    x = orig_call.args[0]
    dtype = str(x.ty.dtype)
    slope = R.multiply(R.exp(R.negative(R.multiply(x, x))), relax.const(2 / math.sqrt(math.pi), dtype))
    return [R.multiply(output_grad, slope)]


GRADIENT_RULES = {
    "relax.nn.relu": relu_grad,
    "relax.clip": clip_grad,
    "relax.erf": erf_grad,
}

_registered = False


def register_gradients():
    global _registered
    if _registered:
        return
    for op_name, rule in GRADIENT_RULES.items():
        register_gradient(op_name, rule, level=OVERRIDE_LEVEL)
    _registered = True
