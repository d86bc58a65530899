"""The int8 layer program → the two step programs (train_step, predict) over arena slots,
and their C kernels rendered from this package's Jinja templates.

The programs use the same IR as the float path (program/ir.py), so the same arena planner and
project emitter handle them. Slots: the int8 weights (parameters) with their exponents
(buffers), one int32 state vector (layers.py; optimizer state, zeroed at init), int8
activations and errors, and int32 accumulators as kernel scratch. ReLU and its backward work
in place; flatten is a view. Each kernel is specialised to its layer's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import numpy as np

from ..frontend.forward import c_ident, c_name
from ..niti import loss as loss_rules
from ..niti import tables as fallback
from ..niti.rescale import ADAPTIVE, EXACT, EXACT_COUNTED, EXPONENT
from ..program.ir import Call, Program, Slot
from ..project.emit import c_array
from .layers import (
    INPUT_EXPONENT_INDEX,
    Conv,
    Elementwise,
    Flatten,
    LayerProgram,
    MaxPool,
    ReLU,
    elements,
    site_offset,
)
from .update import NITI

TEMPLATES = Path(__file__).parent / "templates"
ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                         lstrip_blocks=True, keep_trailing_newline=True,
                         undefined=jinja2.StrictUndefined)


@dataclass
class Int8Programs:
    train: Program
    predict: Program
    state: dict  # state_dict-style name -> Slot (weights, exponents)
    opt_state: dict  # "niti" -> [the state vector]
    inputs: list[Slot]
    labels: Slot
    output: Slot
    kernels: list[str] = field(default_factory=list)


class _Builder:
    def __init__(self, program: LayerProgram, config: NITI, isa: str = "scalar"):
        self.p, self.config, self.isa = program, config, isa
        self.kernels: dict[str, str] = {
            # the element rules and vector rows first: niti_common's rescaling calls them
            "ub_niti_simd": ENV.get_template("niti_simd.c.j2").render(isa=isa, prefix="ub_niti_"),
            "ub_niti_common": ENV.get_template("niti_common.c.j2").render(),
        }
        self.temp = 0

    def kernel(self, template: str, op: str, layer: int, **params) -> str:
        name = f"ub_s8_{op}_l{layer}_ukernel__{self.isa}"
        if name not in self.kernels:
            self.kernels[name] = ENV.get_template(template).render(name=name, isa=self.isa,
                                                                   **params)
        return name

    def im2col(self, layer_index: int, layer: Conv) -> str | None:
        """The patch gatherer of a convolution, emitted once before its first user."""
        if layer.linear:
            return None
        return self.kernel(_conv_template(layer, self.isa), "im2col", layer_index,
                           variant="im2col", **_conv_params(layer))

    def tables(self, layer_index: int, layer: Elementwise) -> str:
        """The tables of a float-fallback op, emitted once before their first user."""
        name = f"ub_s8_{layer.op.split('.')[-1]}_tables_l{layer_index}"
        if name not in self.kernels:
            self.kernels[name] = ENV.get_template("niti_layers.c.j2").render(
                variant="tables", name=name, op=layer.op, where=layer.where,
                rows=len(layer.f_exp), e_lo=fallback.E_LO, e_hi=fallback.E_HI,
                f=c_array(layer.f), f_exp=c_array(layer.f_exp), d=c_array(layer.d))
        return name

    def slot(self, shape, dtype="int8", kind="activation", what="t") -> Slot:
        self.temp += 1
        return Slot(f"{what}{self.temp}", tuple(int(d) for d in shape), dtype, kind)

    def scratch(self, nbytes: int) -> Slot:
        return self.slot((nbytes,), "uint8", "scratch", "scratch")


def _conv_params(layer: Conv) -> dict:
    b, c, h, w = layer.in_shape
    _, o, oh, ow = layer.out_shape
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel, layer.stride, layer.padding
    return dict(B=b, C=c, H=h, W=w, O=o, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
                K=c * kh * kw, where=layer.where or "<top>", rows=_tap_ranges(kh, sh, ph, h, oh),
                cols=_tap_ranges(kw, sw, pw, w, ow))


def _tap_ranges(taps: int, stride: int, pad: int, size: int, out: int) -> list[tuple[int, int]]:
    """Per tap t, the outputs [lo, hi) whose input o * stride + t - pad lies inside [0, size)."""
    ranges = []
    for t in range(taps):
        lo = min(out, max(0, -(-(pad - t) // stride)))
        hi = max(lo, min(out, (size - 1 + pad - t) // stride + 1))
        ranges.append((lo, hi))
    return ranges


# ISAs whose int8 strength is a dot product over contiguous bytes (Cortex-M SMLAD): their
# layers keep position-major patches, a dot per output and an axpy per nonzero error
# (niti_*_dot.c.j2); the others go through the gemms of niti_simd.
DOT_ISAS = ("cmsis_dsp",)


def _conv_template(layer: Conv, isa: str) -> str:
    """Linear layers get their own loops over contiguous rows."""
    suffix = "_dot" if isa in DOT_ISAS else ""
    return f"niti_{'linear' if layer.linear else 'conv2d'}{suffix}.c.j2"


def _patch_bytes(layer: Conv) -> int:
    """int8 patches of every output position (none for a linear layer)."""
    if layer.linear:
        return 0
    b, _, oh, ow = layer.out_shape
    return b * oh * ow * layer.in_shape[1] * layer.kernel[0] * layer.kernel[1]


def weight_grad_chunk(layer: Conv, cache_bytes: int | None) -> int:
    """Images per chunk of a weight-gradient convolution: as many as keep one chunk's
    patches, errors and inputs within `cache_bytes` (None: the whole batch), at least one."""
    b, o, oh, ow = layer.out_shape
    if layer.linear or cache_bytes is None:
        return b
    _, c, h, w = layer.in_shape
    per_image = oh * ow * (c * layer.kernel[0] * layer.kernel[1] + o) + c * h * w
    return max(1, min(b, cache_bytes // per_image))


def _macs(layer: Conv) -> dict:
    """Multiply-accumulates of each of the layer's three products (placement.py's costs)."""
    b, o, oh, ow = layer.out_shape
    return {"macs": b * o * oh * ow * layer.in_shape[1] * layer.kernel[0] * layer.kernel[1]}


def _op(layer: Conv) -> str:
    return "linear" if layer.linear else "conv2d"


def build_int8_programs(program: LayerProgram, config: NITI, isa: str = "scalar",
                        cache_bytes: int | None = None) -> Int8Programs:
    """`cache_bytes`: the working-set bound of a weight-gradient convolution (a DSP's cache),
    which splits it by images (weight_grad_chunk); None keeps the whole batch together."""
    bld = _Builder(program, config, isa)
    batch = program.input_shape[0]
    x = Slot(c_ident(program.input_name), program.input_shape, "float32", "input")
    labels = Slot("labels", (batch,), "int64", "label")
    loss = Slot("loss", (), "float32", "output")
    output = Slot("output", tuple(program.output_shape), "float32", "output")
    state_vec = Slot("niti_state", (program.state_size,), "int32", "optimizer_state",
                     label="niti.state")
    weights, exps, state = {}, {}, {}
    for name, (w8, e) in program.weights.items():
        weights[name] = Slot(c_name(name), w8.shape, "int8", "parameter", value=w8, label=name)
        exps[name] = Slot(c_name(name) + "_exponent", (1,), "int32", "buffer",
                          value=np.array([e], np.int32), label=name + ".exponent")
        state[name] = weights[name]
        state[name + ".exponent"] = exps[name]
    schedule = [(m, until) for m, until in zip(config.mu, list(config.milestones) + [None])]
    train_mode = ADAPTIVE if config.adaptive_rescale else EXACT_COUNTED

    def forward(mode: int, suffix: str):
        calls, saved = [], []
        n_in = elements(program.input_shape)
        h = bld.slot(program.input_shape, what="x_q")
        calls.append(Call(bld.kernel("niti_io.c.j2", "quantize" + suffix, 0, variant="quantize",
                                     n=n_in, exp_index=INPUT_EXPONENT_INDEX),
                          [x, state_vec, h], [1, 2]))
        exp_index, in_exps = INPUT_EXPONENT_INDEX, []
        for i, layer in enumerate(program.layers):
            saved.append(h)
            in_exps.append(exp_index)
            if isinstance(layer, Conv):
                y = bld.slot(layer.out_shape[:2] if layer.linear else layer.out_shape, what="y")
                name = bld.kernel(_conv_template(layer, isa), _op(layer) + suffix, i,
                                  variant="forward",
                                  site=site_offset(layer.fwd_site), mode=mode,
                                  max_interval=config.max_interval, in_exp=exp_index,
                                  im2col=bld.im2col(i, layer), **_conv_params(layer))
                # the dot layers gather the batch's patches at once, the gemm layers per image
                patches = _patch_bytes(layer) // (1 if isa in DOT_ISAS else layer.out_shape[0])
                acc = bld.scratch(4 * elements(layer.out_shape) + patches)
                calls.append(Call(name, [h, weights[layer.weight], exps[layer.weight], state_vec,
                                         y], [3, 4], scratch=acc, attrs=_macs(layer)))
                exp_index = site_offset(layer.fwd_site) + EXPONENT
                h = y
            elif isinstance(layer, ReLU):
                name = bld.kernel("niti_layers.c.j2", "relu", i, variant="relu",
                                  n=elements(layer.shape), where=layer.where)
                calls.append(Call(name, [h], [0]))
            elif isinstance(layer, Elementwise):
                y = bld.slot(layer.shape, what="y")
                name = bld.kernel("niti_layers.c.j2", "table", i, variant="table",
                                  n=elements(layer.shape), in_exp=exp_index, where=layer.where,
                                  site=site_offset(layer.fwd_site), tables=bld.tables(i, layer))
                calls.append(Call(name, [h, state_vec, y], [1, 2]))
                exp_index = site_offset(layer.fwd_site) + EXPONENT
                h = y
            elif isinstance(layer, MaxPool):
                b, c, hh, ww = layer.in_shape
                y = bld.slot(layer.out_shape, what="pool")
                name = bld.kernel("niti_layers.c.j2", "max_pool", i, variant="max_pool", B=b, C=c,
                                  H=hh, W=ww, OH=layer.out_shape[2], OW=layer.out_shape[3],
                                  KH=layer.kernel[0], KW=layer.kernel[1], where=layer.where)
                calls.append(Call(name, [h, y], [1]))
                h = y
            elif isinstance(layer, Flatten):
                h = Slot(h.name + "_flat", layer.out_shape, "int8", h.kind, view_of=h)
        return calls, saved, h, exp_index, in_exps

    # ---- predict: exact shifts, float logits out ---------------------------------------------
    calls, _, logits, exp_index, _ = forward(EXACT, "_predict")
    calls.append(Call(bld.kernel("niti_io.c.j2", "dequantize", 0, variant="dequantize",
                                 n=elements(program.output_shape), exp_index=exp_index),
                      [logits, state_vec, output], [2]))
    predict = Program("predict", calls)

    # ---- train_step ----------------------------------------------------------------------------
    calls, saved, logits, exp_index, in_exps = forward(train_mode, "")
    classes = program.classes
    err = bld.slot(program.output_shape, what="err")
    calls.append(Call(bld.kernel("niti_io.c.j2", "softmax_xent_grad", 0, variant="loss",
                                 B=batch, K=classes, exp_index=exp_index,
                                 log2e=loss_rules.LOG2E_Q15, top=loss_rules.TOP_EXPONENT,
                                 fraction_bits=loss_rules.GRAD_FRACTION_BITS,
                                 error_shift=loss_rules.ERROR_SHIFT),
                      [logits, labels, state_vec, err, loss], [3, 4],
                      scratch=bld.scratch(4 * classes)))
    for i in range(len(program.layers) - 1, program.first_trained() - 1, -1):
        layer, x_in = program.layers[i], saved[i]
        if isinstance(layer, Conv):
            params = _conv_params(layer)
            w = weights[layer.weight]
            err_in = None
            if layer.error_site >= 0:
                err_in = bld.slot(x_in.shape, what="err")
                name = bld.kernel(_conv_template(layer, isa), _op(layer) + "_input_grad", i,
                                  variant="input_grad", site=site_offset(layer.error_site),
                                  mode=train_mode, max_interval=config.max_interval, **params)
                # the columns of one image: K x OH*OW int32
                col = 0 if layer.linear else 4 * params["K"] * elements(layer.out_shape[2:])
                calls.append(Call(name, [err, w, state_vec, err_in], [2, 3],
                                  scratch=bld.scratch(4 * elements(layer.in_shape) + col),
                                  attrs=_macs(layer)))
            if layer.trainable:
                n_w = elements(layer.weight_shape)
                chunk = weight_grad_chunk(layer, cache_bytes)
                name = bld.kernel(_conv_template(layer, isa), _op(layer) + "_filter_grad_update",
                                  i, variant="filter_update", site=site_offset(layer.grad_site),
                                  mode=train_mode, max_interval=config.max_interval,
                                  schedule=schedule, im2col=bld.im2col(i, layer), chunk=chunk,
                                  **params)
                patches = _patch_bytes(layer) // layer.out_shape[0] * chunk
                calls.append(Call(name, [x_in, err, state_vec, w], [2, 3],
                                  scratch=bld.scratch(5 * n_w + patches),
                                  attrs=_macs(layer)))
            err = err_in
        elif isinstance(layer, ReLU):
            # the ReLU ran in place: its output is the buffer saved for the next layer
            y = saved[i + 1] if i + 1 < len(saved) else logits
            name = bld.kernel("niti_layers.c.j2", "relu_backward", i, variant="relu_backward",
                              n=elements(layer.shape), where=layer.where)
            calls.append(Call(name, [y, err], [1]))
        elif isinstance(layer, Elementwise):
            err_in = bld.slot(layer.shape, what="err")
            name = bld.kernel("niti_layers.c.j2", "table_backward", i, variant="table_backward",
                              n=elements(layer.shape), in_exp=in_exps[i], where=layer.where,
                              site=site_offset(layer.error_site), mode=train_mode,
                              max_interval=config.max_interval, tables=bld.tables(i, layer))
            calls.append(Call(name, [x_in, err, state_vec, err_in], [2, 3],
                              scratch=bld.scratch(4 * elements(layer.shape))))
            err = err_in
        elif isinstance(layer, MaxPool):
            b, c, hh, ww = layer.in_shape
            err_in = bld.slot(layer.in_shape, what="err")
            name = bld.kernel("niti_layers.c.j2", "max_pool_backward", i,
                              variant="max_pool_backward", B=b, C=c, H=hh, W=ww,
                              OH=layer.out_shape[2], OW=layer.out_shape[3], KH=layer.kernel[0],
                              KW=layer.kernel[1], where=layer.where)
            calls.append(Call(name, [x_in, err, err_in], [2]))
            err = err_in
        elif isinstance(layer, Flatten):
            err = Slot(err.name + "_unflat", layer.in_shape, "int8", err.kind, view_of=err)
    calls.append(Call(bld.kernel("niti_io.c.j2", "step_done", 0, variant="step_done"),
                      [state_vec], [0]))
    train = Program("train_step", calls)
    return Int8Programs(train=train, predict=predict, state=state,
                        opt_state={"niti": [state_vec]}, inputs=[x], labels=labels,
                        output=output, kernels=list(bld.kernels.values()))
