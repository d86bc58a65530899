"""NITI's integer training step in numpy, read off the model's own ATen graph: the reference
the int8 compile (training/niti_graph.py, then the generated C) must equal bit for bit.

It shares nothing with the compile but the integer rules of ubitrain.niti: it walks the graph
that torch.export gives (not Relax's), computes the forward op by op and the backward by the
hand-written rules below, in reverse order. The spec it implements (docs/algorithms.md):

- an activation or error is int8 with an exponent; the model input is quantized first;
- conv2d / linear accumulate int8 x int8 in int64 (exact), the int32 bias aligned to the
  accumulator's exponent is added (the sum made coarser where the bias would overflow),
  and the first consumer that is not a bias add reads the sum narrowed to int8 at a
  rescale site (the shift of the maximum's bit length - 7);
- BatchNorm in training: NITI's integer BatchNorm with batch statistics (niti/batch_norm.py),
  gamma x_hat + beta an accumulator like a conv's; its running statistics (`running`) move
  each step and serve predict;
- add of two int8 tensors: the aligned sum (niti/align.py), narrowed by its reader;
- relu and max pooling (windows that tile) on int8; flatten / view as a reshape;
- average pooling (windows that tile; adaptive to sizes that divide the map; a mean over
  height and width): the window's sum times a fixed-point reciprocal (niti/pooling.py),
  narrowed by its reader; its backward spreads the error times the same reciprocal;
- loss: the integer softmax cross-entropy gradient, error exponent 0;
- backward: a weight gradient and a bias gradient are int32 sums (returned as they are, for
  the optimizer); an input error is an int32 sum narrowed at its own site; where a tensor
  feeds two readers, their errors are added aligned and narrowed.

Rescale sites use the exact shift (EXACT_COUNTED) or adaptive rescaling (ADAPTIVE); the
reference keys each by what it narrows, so their order, which differs from the compile's,
does not matter.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import torch

from ..errors import UnsupportedOpError
from ..frontend.torch_export import export_module
from ..niti import batch_norm as bn
from ..niti.align import align_bias, aligned_concat, aligned_sum
from ..niti.channel_exponents import to_coarsest, weight_at_coarsest
from ..niti.int_conv import conv2d, conv2d_input_grad, conv2d_weight_grad
from ..niti.loss import cross_entropy, softmax_xent_grad
from ..niti.pooling import AVERAGE_BITS, avg_pool, avg_pool_backward, max_pool, max_pool_backward
from ..niti.quantize import dequantize, quantize
from ..niti.rescale import EXACT, EXACT_COUNTED, SITE_FIELDS, site_shift
from ..niti.rounding import as_i64, clip8, int8_bound, round_shift
from ..niti.tables import table_index, tables

aten = torch.ops.aten


class Sites:
    """One rescale site per narrowing, keyed by what it narrows (a node's output, the error
    into a node, the n-th sum of errors at a node), its state kept from step to step: the
    same sites as the compile's, whatever order either creates them in."""

    def __init__(self, mode: int, max_interval: int):
        self.mode, self.max_interval = mode, max_interval
        self.rows: dict[tuple, np.ndarray] = {}

    def narrow(self, total, exponent: int, key: tuple, mode: int | None = None):
        row = self.rows.setdefault(key, np.zeros(SITE_FIELDS, np.int64))
        s = site_shift(total, row, 7, self.mode if mode is None else mode, self.max_interval)
        return clip8(round_shift(total, s)), exponent + s


AVERAGES = (aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default, aten.mean.dim)
# functions by compile-time table (niti/tables.py), by their tables' name
TABLES = {aten.sigmoid.default: "aten.sigmoid", aten.tanh.default: "aten.tanh",
          aten.silu.default: "aten.silu", aten.gelu.default: "aten.gelu",
          aten.hardswish.default: "aten.hardswish", aten.hardsigmoid.default: "aten.hardsigmoid"}


def _node_tables(node) -> tuple:
    """(F, F exponents, D, D exponents) of a table node (GELU's approximate as it says)."""
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return tables(TABLES[node.target],
                  **({} if approximate == "none" else {"approximate": approximate}))


def _groups(args) -> int:
    if len(args) > 5 and _pair(args[5], 1) != (1, 1):
        raise UnsupportedOpError("the NITI reference has no rule for a dilated convolution")
    return args[6] if len(args) > 6 else 1


def _relu6_top(node, exponent: int) -> int:
    low = node.args[1] if len(node.args) > 1 else -1.0  # hardtanh's defaults
    high = node.args[2] if len(node.args) > 2 else 1.0
    if low != 0 or high <= 0 or high != int(high):
        raise UnsupportedOpError(f"the NITI reference has no rule for hardtanh({low}, {high})")
    return int8_bound(int(high), exponent)


def _map_shape(node) -> tuple[int, ...]:
    """The average's output as [B, C, OH, OW] (a mean without keepdim drops OH, OW)."""
    b, c, h, w = node.args[0].meta["val"].shape
    kh, kw = _average_window(node)
    return (b, c, h // kh, w // kw)


def _average_window(node) -> tuple[int, int]:
    """The window of an average that tiles its input; anything else is refused."""
    args, op = node.args, node.target
    h, w = node.args[0].meta["val"].shape[2:]
    if op == aten.avg_pool2d.default:
        kernel = _pair(args[1], None)
        stride = _pair(args[2] if len(args) > 2 and args[2] else None, kernel)
        padding = _pair(args[3] if len(args) > 3 else 0, 0)
        if stride == kernel and padding == (0, 0) and not any(args[4:5]) \
                and (len(args) < 7 or args[6] is None):  # no ceil_mode, no divisor
            return kernel
    elif op == aten.adaptive_avg_pool2d.default:
        oh, ow = _pair(args[1], None)
        if h % oh == 0 and w % ow == 0:
            return (h // oh, w // ow)
    elif sorted(d % 4 for d in args[1]) == [2, 3]:  # mean over height and width
        return (h, w)
    raise UnsupportedOpError(f"the NITI reference has no rule for {op} with {list(args[1:])}")


class Value:
    """A forward value: int8 `q` at exponent `e`, or an int64 `total` not yet narrowed."""

    def __init__(self, q=None, e=0, total=None):
        self.q, self.e, self.total = q, e, total
        self.narrow = None  # (total, exponent) -> (int8, exponent): set by its producer

    def int8(self) -> tuple[np.ndarray, int]:
        if self.q is None:
            self.q, self.e = self.narrow(self.total, self.e)
        return self.q, self.e


def _pair(v, default):
    v = default if v is None else v
    return (v, v) if isinstance(v, int) else tuple(v) * (2 // len(v))


class NitiGraphReference:
    """One NITI step of `model` on integer parameters: `step(x, labels, params)` with params
    {state_dict name: (values, exponent)}, int8 weights and int32 biases. Returns the loss and
    {name: int64 gradient} before any update. `mode`: rescaling in training
    (niti/rescale.py EXACT_COUNTED, or ADAPTIVE with `max_interval`); the sites' state
    carries over from one step() to the next."""

    def __init__(self, model: torch.nn.Module, example_input: torch.Tensor,
                 mode: int = EXACT_COUNTED, max_interval: int = 1):
        exported = export_module(model, (example_input,), training=True)
        self.graph = exported.graph
        self.names = dict(exported.graph_signature.inputs_to_parameters)  # placeholder -> name
        self.buffers = dict(exported.graph_signature.inputs_to_buffers)
        self.mutated = dict(exported.graph_signature.buffers_to_mutate)
        self.sites = Sites(mode, max_interval)
        # an integer BatchNorm's running statistics, by module name: [mean, var, e_mean, e_var]
        # (niti/batch_norm.py), set by the caller; training steps move them
        self.running: dict[str, list] = {}
        self.saved: dict[str, tuple] = {}  # a BatchNorm's (x_hat, (r, g), e_x), for its backward
        self.training = True
        self.momentum: float | None = None  # the BatchNorms' own, unless set

    def narrow(self, total, exponent: int, *key):
        return self.sites.narrow(total, exponent, key)

    def forward(self, x, params, mode: int | None = None):
        """(each node's Value, the call nodes in order, the logits node)."""
        values, order = {}, []
        for node in self.graph.nodes:
            if node.op == "placeholder":
                if node.name in self.buffers:  # BatchNorm's statistics: self.running
                    continue
                if node.name in self.names:
                    q, e = params[self.names[node.name]]
                else:
                    q, e = quantize(x)
                values[node] = Value(as_i64(q), e)
            elif node.op == "call_function":
                if node.target == operator.getitem:  # a BatchNorm's output or statistics
                    if node.args[1] == 0:
                        values[node] = values[node.args[0]]
                        order.append(node)
                    continue
                if any(a.op == "placeholder" and a.name in self.buffers for a in node.args
                       if isinstance(a, torch.fx.Node)) and node.target == aten.add.Tensor:
                    continue  # num_batches_tracked + 1
                values[node] = value = self.forward_op(node, values)
                value.narrow = functools.partial(self.sites.narrow, key=("out", node.name),
                                                 mode=mode)
                order.append(node)
            elif node.op == "output":
                out = node.args[0]
                # the outputs after the running statistics the step moves
                logits = out[len(self.mutated)] if isinstance(out, (list, tuple)) else out
        return values, order, logits

    def predict(self, x, params) -> np.ndarray:
        self.training = False
        try:
            values, _, logits = self.forward(x, params, EXACT)
        finally:
            self.training = True
        return dequantize(*values[logits].int8())

    def recalibrate(self, inputs, params):
        """The BatchNorms' running statistics again from forwards on `inputs` (batches
        of x) with the parameters as they are: their cumulative average."""
        try:
            for k, x in enumerate(inputs):
                self.momentum = 1.0 / (k + 1)
                self.forward(x, params, EXACT)
        finally:
            self.momentum = None

    def step(self, x, labels, params: dict[str, tuple[np.ndarray, int]]):
        values, order, logits = self.forward(x, params)
        zq, ze = values[logits].int8()
        loss = cross_entropy(zq, ze, labels)
        errors = {logits: (as_i64(softmax_xent_grad(zq, ze, labels)), 0)}
        grads, self.sums = {}, {}
        for node in reversed(order):
            if node not in errors:
                continue
            err, ee = errors.pop(node)
            for target, (g, eg) in self.backward(node, values, err, ee):
                if target.name in self.names:
                    grads[self.names[target.name]] = g
                elif target.op == "call_function":
                    self._add_error(errors, target, g, eg)
        return loss, grads

    def _add_error(self, errors, target, g, eg):
        if target in errors:  # a second reader's error: added aligned, narrowed
            total, e = aligned_sum(*errors[target], g, eg)
            n = self.sums[target] = self.sums.get(target, 0) + 1
            errors[target] = self.narrow(total, e, "sum", target.name, n)
        else:
            errors[target] = (g, eg)

    # ---- forward -----------------------------------------------------------------------------
    def forward_op(self, node, values):
        args = [values.get(a, a) for a in node.args]
        op = node.target
        if op in (aten.conv2d.default, aten.linear.default):
            x, w = args[0].int8(), args[1]
            bias = args[2] if len(args) > 2 else None
            if op == aten.linear.default:
                total = as_i64(x[0]) @ w.q.T
            else:
                stride, padding = _pair(args[3] if len(args) > 3 else 1, 1), \
                    _pair(args[4] if len(args) > 4 else 0, 0)
                total = conv2d(x[0], w.q, stride, padding, _groups(args))
            e_w = w.e
            if np.ndim(e_w):  # an exponent per output channel: to the coarsest
                total, e_w = to_coarsest(total, e_w, axis=1)
            e = x[1] + e_w
            if isinstance(bias, Value):
                total, coarser = align_bias(total, e, bias.q, bias.e)
                e += coarser
            return Value(total=total, e=e)
        if op == aten._native_batch_norm_legit_functional.default:
            return self._batch_norm(node, args)
        if op == aten.add.Tensor:
            (a, ea), (b, eb) = args[0].int8(), args[1].int8()
            total, e = aligned_sum(a, ea, b, eb)
            return Value(total=total, e=e)
        if op == aten.cat.default:
            dim = node.args[1] if len(node.args) > 1 else 0
            total, e = aligned_concat([values[t].int8() for t in node.args[0]], dim)
            return Value(total=total, e=e)
        if op in (aten.relu.default, aten.relu_.default):
            q, e = args[0].int8()
            return Value(np.maximum(q, 0), e)
        if op == aten.hardtanh.default:  # ReLU6
            q, e = args[0].int8()
            return Value(np.clip(q, 0, _relu6_top(node, e)), e)
        if op == aten.max_pool2d.default:
            q, e = args[0].int8()
            return Value(max_pool(q, _pair(args[1], None)), e)
        if op in TABLES:
            f, f_exp, _, _ = _node_tables(node)
            col, row = table_index(*args[0].int8())
            return Value(f[row][col], int(f_exp[row]))
        if op in AVERAGES:
            q, e = args[0].int8()
            total = avg_pool(q, _average_window(node)).reshape(node.meta["val"].shape)
            return Value(total=total, e=e - AVERAGE_BITS)
        if op in (aten.flatten.using_ints, aten.view.default, aten.reshape.default):
            q, e = args[0].int8()
            return Value(q.reshape(tuple(node.meta["val"].shape)), e)
        raise UnsupportedOpError(f"the NITI reference has no rule for {op}")

    def _batch_norm(self, node, args):
        """Integer BatchNorm (niti/batch_norm.py): y = gamma x_hat + beta, an accumulator."""
        q, e = args[0].int8()
        gamma, beta = args[1], args[2]
        owner = self.buffers[node.args[3].name].rpartition(".")[0]  # its running mean's
        running = self.running[owner]
        if self.training:
            x_hat, r = bn.normalize(q)
            self.saved[node.name] = (x_hat, r, e)
            momentum = node.args[6] if self.momentum is None else self.momentum
            running[:2] = bn.update_running(*running, q, e, momentum)
        else:
            x_hat = bn.normalize_running(q, e, *running)
        if gamma is None:  # affine=False: y = x_hat
            return Value(x_hat, -bn.F)
        shape = [1] * q.ndim
        shape[1] = -1
        total = x_hat * as_i64(gamma.q).reshape(shape)
        e_total = gamma.e - bn.F
        total, coarser = align_bias(total, e_total, beta.q, beta.e)
        return Value(total=total, e=e_total + coarser)

    # ---- backward: [(input node, (error or gradient, exponent))] ----------------------------
    def backward(self, node, values, err, ee) -> list:
        """Each input's share of the error, in the order of the inputs (a node read twice,
        as in x + x, gets two)."""
        if node.target == aten.add.Tensor:
            return [(a, (err, ee)) for a in node.args]
        if node.target == aten.cat.default:
            dim = node.args[1] if len(node.args) > 1 else 0
            sizes = [values[t].int8()[0].shape[dim] for t in node.args[0]]
            parts = np.split(err, np.cumsum(sizes)[:-1], axis=dim)
            return [(t, (p, ee)) for t, p in zip(node.args[0], parts)]
        return list(self._backward_one(node, values, err, ee).items())

    def _backward_one(self, node, values, err, ee) -> dict:
        op, args = node.target, node.args
        out = {}
        if op == operator.getitem:
            return {args[0]: (err, ee)}
        if op == aten._native_batch_norm_legit_functional.default:
            x_hat, r, e_x = self.saved[node.name]
            gamma = values.get(args[1])  # None: affine=False
            axes = (0,) + tuple(range(2, err.ndim))
            shape = [1] * err.ndim
            shape[1] = -1
            if gamma is None:  # affine=False: the error is x_hat's
                d_hat, e_hat = err, ee
            else:
                out[args[1]] = ((as_i64(err) * x_hat).sum(axis=axes), ee - bn.F)
                out[args[2]] = (as_i64(err).sum(axis=axes), ee)
                d_hat, e_hat = self.narrow(as_i64(err) * gamma.q.reshape(shape), ee + gamma.e,
                                           "x_hat error", node.name)
            dx, e_dx = bn.normalize_backward(d_hat, x_hat, r, e_x, e_hat)
            if args[0].op == "call_function":
                out[args[0]] = self.narrow(dx, e_dx, "error", node.name)
            return out
        if op in (aten.conv2d.default, aten.linear.default):
            x, w = values[args[0]], values[args[1]]
            xq, xe = x.int8()
            wq, we = weight_at_coarsest(w.q, w.e) if np.ndim(w.e) else (w.q, w.e)
            if op == aten.linear.default:
                out[args[1]] = (err.T @ as_i64(xq), ee + xe)
                total = err @ wq
            else:
                stride = _pair(args[3] if len(args) > 3 else 1, 1)
                padding = _pair(args[4] if len(args) > 4 else 0, 0)
                groups = _groups(args)
                out[args[1]] = (conv2d_weight_grad(xq, err, w.q.shape[2:], stride, padding,
                                                   groups), ee + xe)
                total = conv2d_input_grad(err, wq, xq.shape, stride, padding, groups)
            if len(args) > 2 and args[2] is not None:
                axes = (0,) if err.ndim == 2 else (0, 2, 3)
                out[args[2]] = (err.sum(axis=axes), ee)
            if args[0].op == "call_function":
                out[args[0]] = self.narrow(total, ee + we, "error", node.name)
            return out
        if op in (aten.relu.default, aten.relu_.default):
            return {args[0]: (np.where(values[node].q > 0, err, 0), ee)}
        if op == aten.hardtanh.default:
            q, e = values[args[0]].int8()
            return {args[0]: (np.where((q > 0) & (q < _relu6_top(node, e)), err, 0), ee)}
        if op == aten.max_pool2d.default:
            q, _ = values[args[0]].int8()
            return {args[0]: (max_pool_backward(q, err, _pair(args[1], None)), ee)}
        if op in TABLES:
            _, _, d, d_exp = _node_tables(node)
            col, row = table_index(*values[args[0]].int8())
            if args[0].op != "call_function":
                return {}
            return {args[0]: self.narrow(as_i64(err) * d[row][col], ee + int(d_exp[row]),
                                         "error", node.name)}
        if op in AVERAGES:
            shape = values[args[0]].int8()[0].shape
            spread = avg_pool_backward(err.reshape(_map_shape(node)), _average_window(node),
                                       shape)
            return {args[0]: self.narrow(spread, ee - AVERAGE_BITS, "error", node.name)}
        if op in (aten.flatten.using_ints, aten.view.default, aten.reshape.default):
            return {args[0]: (err.reshape(values[args[0]].int8()[0].shape), ee)}
        raise UnsupportedOpError(f"the NITI reference has no backward rule for {op}")
