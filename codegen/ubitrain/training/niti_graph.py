"""The float training graph rewritten into NITI's integer one (precision="int8").

The rewrite walks `main` of the training module (trace: forward, loss, Relax's Gradient) and
gives every float tensor an integer form:

- an activation or error is int8 values with an int32 exponent of shape (1,): `Quantized`
  (value = q 2^e);
- a conv or matmul gives an int32 accumulator whose exponent is the sum of its operands':
  `Accumulator`. It stays int32 while a bias joins it (aligned: niti/align.py align_bias) and
  where it is a gradient (a weight's or a bias's: the optimizer renormalizes it); any other
  consumer reads it narrowed to int8 at a rescale site of its own (ops/niti.py `rescale`);
- a weight is an int8 parameter, a bias an int32 one, each with an exponent parameter;
- a ReLU's mask, max pooling, reshapes, transposes and broadcasts work on the int8 values as
  they are;
- an average (pooling over windows that tile, a mean over height and width, and the division
  of their backward) is an int32 sum times round(2^16 / n) at exponent e - 16
  (niti/pooling.py), an accumulator like a conv's.

The result is a Relax function with the integer parameters, one int32[6] parameter per
rescale site (returned updated, for the step to copy back), the float loss and one int32
gradient per trained parameter. Every op it does not know is refused by name.

Here: the walk (`Rewriter`) and the function it builds (`rewrite_step`). The integer forms
are in niti_values.py, each op's rule in niti_rules.py, BatchNorm's in
niti_batch_norm_rules.py, the table functions' (GELU, Sigmoid, Hardswish...) in
niti_table_rules.py.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ..errors import UnsupportedOpError
from ..niti.rescale import EXACT
from ..ops import niti
from ..ops.fused_ops import fused_op_of
from .niti_batch_norm_rules import batch_norm_backward, batch_norm_train
from .niti_rules import RULES
from .niti_table_rules import table_backward, table_forward
from .niti_values import (
    INT8,
    INT32,
    Accumulator,
    Parameter,
    Quantized,
    ZeroGradient,
    dtype_of,
    shape_of,
)


class ConstantOperand(Exception):
    """An op of the float graph reads a constant: no integer form (NITI's ops read int8 or
    int32 tensors with exponents), and the rule asking for one does not know which op."""


class Forms(dict):
    """Each float var's integer form. A constant has none: asked for one, it raises
    ConstantOperand, which `Rewriter.visit` refuses naming the op, not a bare KeyError."""

    def __missing__(self, key):
        if isinstance(key, tvm.ir.Constant):
            raise ConstantOperand(key)
        raise KeyError(key)


def _moved(value):
    """A buffer's new value as the step returns it (a count is kept as a Parameter)."""
    return value.var if isinstance(value, Parameter) else value


class Rewriter:
    """The walk over the float function: each binding's integer form (`env`), the rescale
    sites it creates, and the accumulators it narrows (once each)."""

    def __init__(self, func: relax.Function, mode: int, max_interval: int):
        self.func, self.mode, self.max_interval = func, mode, max_interval
        self.bb = relax.BlockBuilder()
        self.env = Forms()  # float var -> its integer form
        self.narrowed: dict[int, Quantized] = {}  # id(Accumulator) -> its int8 form
        self.kept: list = []  # each narrowed Accumulator, alive: its id is not reused
        self.sites: list[tuple[str, relax.Var]] = []
        self.new_sites: list[relax.Expr] = []
        self.zero_exponent = relax.const(np.zeros(1, np.int32))

    # ---- values ----------------------------------------------------------------------------
    def emit(self, expr, name: str = ""):
        return self.bb.emit(expr, name)

    def quantized(self, value, where: str) -> Quantized:
        """`value` as int8: an accumulator is narrowed at a rescale site of its own, once."""
        if isinstance(value, Quantized):
            return value
        if isinstance(value, Accumulator):
            if id(value) not in self.narrowed:
                self.kept.append(value)
                if value.view is not None:  # one site for the sum and its reshapes
                    origin, make = value.view
                    q = self.quantized(origin, where)
                    self.narrowed[id(value)] = Quantized(self.emit(make(q.q)), q.e)
                else:
                    self.narrowed[id(value)] = self.rescale(value, where)
            return self.narrowed[id(value)]
        raise UnsupportedOpError(f"precision='int8': {where} reads {type(value).__name__}, "
                                 "which has no int8 form")

    def rescale(self, acc: Accumulator, where: str) -> Quantized:
        if self.mode == EXACT:  # predict: no site
            out = self.emit(niti.rescale_exact(acc.total, acc.exponents), "narrowed")
            return Quantized(self.emit(relax.TupleGetItem(out, 0)),
                             self.emit(relax.TupleGetItem(out, 1)))
        site = relax.Var(f"site{len(self.sites)}", niti.SITE_TYPE)
        self.sites.append((where, site))
        out = self.emit(niti.rescale(acc.total, acc.exponents, site, self.mode,
                                     self.max_interval), "narrowed")
        self.new_sites.append(self.emit(relax.TupleGetItem(out, 2)))
        return Quantized(self.emit(relax.TupleGetItem(out, 0)),
                         self.emit(relax.TupleGetItem(out, 1)))

    def operand(self, value, where: str, channels_out: int | None = None
                ) -> tuple[relax.Expr, list]:
        """An int8 operand of a product and its exponent tensors. A weight with an exponent
        per channel keeps them when its channel axis is `channels_out` (the product's
        channels: the caller brings them to the coarsest), else (the backward, where the
        channels are summed over) it is read at the coarsest exponent."""
        if isinstance(value, Parameter):
            if dtype_of(value.var) != INT8:
                raise UnsupportedOpError(f"precision='int8': {where} multiplies by the bias "
                                         f"{value.name}")
            if value.channel_axis is None or value.channel_axis == channels_out:
                return value.var, [value.e]
            if value.channel_axis != 0:
                raise UnsupportedOpError(f"precision='int8': {where} reads {value.name} "
                                         "moved off its output-channel axis")
            # a part's rows read the whole weight's exponents from its first row on
            out = self.emit(niti.weight_at_coarsest(value.var, value.e, value.start))
            return self.emit(relax.TupleGetItem(out, 0)), [
                self.emit(relax.TupleGetItem(out, 1))]
        q = self.quantized(value, where)
        return q.q, [q.e]

    # ---- the walk --------------------------------------------------------------------------
    def outputs(self, exponents: bool = False):
        """(loss, the moved buffers, [(int32 gradient, its exponent)]); the exponents of the
        products' sums are emitted only when asked (micro-batches add them up)."""
        body = self.func.body.body  # (loss, (adjoints...))
        fields = body.fields if isinstance(body, relax.Tuple) else None
        if fields is None:
            raise UnsupportedOpError("precision='int8': the step's outputs are not a tuple")
        first, buffers = fields[0], []
        if isinstance(first, relax.Tuple):  # (loss, the buffers the step moved...)
            first, *moved = first.fields
            buffers = [_moved(self.env[b]) for b in moved]
        loss = self.env[first]
        grads = []  # (int32 gradient, its exponent)
        for adjoint in fields[1].fields:
            value = self.env[adjoint]
            if isinstance(value, ZeroGradient):  # NITI's update leaves the parameter as it is
                grads.append((self.emit(relax.op.zeros(value.shape, INT32)),
                              self.zero_exponent))
            elif isinstance(value, Accumulator) and (value.error_sum or len(shape_of(value.total))
                                                   > 1):
                # a weight's (products) or a bias's (error sum)
                grads.append((value.total, self.exponent_of(value) if exponents else None))
            elif isinstance(value, (Accumulator, Quantized)) and len(shape_of(
                    value.total if isinstance(value, Accumulator) else value.q)) == 1:
                # a bias's gradient whose sum Relax left out (one term: batch 1, one pixel):
                # the error itself, narrowed as every error is
                q = self.quantized(value, "a bias gradient")
                grads.append((self.emit(R.astype(q.q, INT32)), q.e))
            else:
                raise UnsupportedOpError("precision='int8': a gradient that is not an "
                                         "integer sum")
        return loss, buffers, grads

    def exponent_of(self, acc: Accumulator) -> relax.Expr:
        """An accumulator's exponent as one (1,) tensor: the sum of its parts."""
        return functools.reduce(lambda a, b: self.emit(R.add(a, b)), acc.exponents)

    def visit(self, binding):
        value = binding.value
        if isinstance(value, relax.Var):
            return self.env[value]
        if isinstance(value, relax.TupleGetItem):
            return self.env[value.tuple_value][value.index]
        if isinstance(value, relax.Tuple):
            return [self.env.get(f, f) for f in value.fields]
        if not isinstance(value, relax.Call):
            raise UnsupportedOpError(f"precision='int8': {binding.var.name} is a "
                                     f"{type(value).__name__}")
        fused = fused_op_of(value)
        op = fused[0] if fused is not None else value.op.name
        try:
            if fused is not None:
                return self.fused(value, *fused)
            rule = RULES.get(op)
            if rule is None:
                raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {op} "
                                         f"({binding.var.name})")
            return rule(self, value, binding.var.name)
        except ConstantOperand as c:
            value = c.args[0].value.numpy()
            shown = value.tolist() if value.size <= 4 else f"of shape {list(value.shape)}"
            raise UnsupportedOpError(
                f"precision='int8': no integer (NITI) form for {op} ({binding.var.name}) of "
                f"the constant {shown}: NITI's integer ops take no constant operand") from None

    def fused(self, call, op, attrs=None):
        args = [self.env.get(a, a) for a in call.args[1].fields]  # or a constant
        if op == "batch_norm_train":
            return batch_norm_train(self, args, attrs or {})
        if op == "batch_norm_train_backward":
            return batch_norm_backward(self, args)
        if op == "table_activation":
            return table_forward(self, args, attrs or {})
        if op == "table_activation_backward":
            return table_backward(self, args, attrs or {})
        if op == "softmax_cross_entropy":
            logits, labels = self.quantized(args[0], "the logits"), args[1]
            out = self.emit(niti.softmax_xent_grad(logits.q, logits.e, labels), "xent")
            self.error = Quantized(self.emit(relax.TupleGetItem(out, 0)), self.zero_exponent)
            return self.emit(relax.TupleGetItem(out, 1), "loss")
        if op == "softmax_cross_entropy_backward":
            return self.error
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {op}")


def state_params(parameters) -> list[relax.Var]:
    """Each parameter's values, then its exponent where no earlier one gave it: the parts of
    a weight split by channels share the weight's (niti_module.py orders the state so)."""
    out = []
    for p in parameters:
        out.append(p.var)
        if p.e is not None and not any(p.e.same_as(v) for v in out):
            out.append(p.e)
    return out


def rewrite_step(func: relax.Function, name: str, parameters: dict[str, Parameter], mode: int,
                 max_interval: int = 1, sites: int | None = None,
                 gradient_exponents: bool = False):
    """`func` (the training function, or with mode EXACT the predict function) on integers,
    as the function `name`.

    `parameters`: by the name of the float function's parameter, its integer form. The new
    function takes the other parameters (inputs, labels) as they were, then each parameter's
    values and exponent, then the rescale sites (`sites` of them for predict, which reads
    none); the training function returns ((loss, new sites...), (int32 gradients...)),
    each gradient a (gradient, (1,) exponent) pair with `gradient_exponents`, predict the
    logits as float32. Returns (function, the sites' names, in order)."""
    rw = Rewriter(func, mode, max_interval)
    bb = rw.bb
    inputs = [relax.Var(p.name, p.ty) for p in func.params if p.name not in parameters]
    with bb.function(name):
        with bb.dataflow():
            given = iter(inputs)
            for p in func.params:
                if p.name in parameters:
                    rw.env[p] = parameters[p.name]
                    continue
                var = next(given)
                if dtype_of(p) == "float32":  # a model input: quantized at the step's start
                    out = bb.emit(niti.quantize(var), "quantized")
                    rw.env[p] = Quantized(bb.emit(relax.TupleGetItem(out, 0)),
                                          bb.emit(relax.TupleGetItem(out, 1)))
                else:
                    rw.env[p] = var
            for block in func.body.blocks:
                for binding in block.bindings:
                    rw.env[binding.var] = rw.visit(binding)
            if mode == EXACT:
                logits = rw.quantized(rw.env[func.body.body], "the output")
                result = bb.emit_output(niti.dequantize(logits.q, logits.e))
            else:
                loss, buffers, grads = rw.outputs(gradient_exponents)
                # with micro-batches each gradient goes with its exponent, to be added to the
                # others' at one exponent (program/niti_micro_batch.py); alone, NITI's update
                # does not read it
                grads = [relax.Tuple([g, e]) if gradient_exponents else g for g, e in grads]
                result = bb.emit_output(relax.Tuple([relax.Tuple([loss, *buffers,
                                                                  *rw.new_sites]),
                                                     relax.Tuple(grads)]))
        site_vars = [s for _, s in rw.sites] if sites is None else [
            relax.Var(f"site{i}", niti.SITE_TYPE) for i in range(sites)]
        params = inputs + state_params(parameters.values())
        bb.emit_func_output(result, params=params + site_vars)
    return bb.get()[name], [w for w, _ in rw.sites]
