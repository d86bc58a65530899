"""CMSIS-NN's s8 forward kernels beside the int8 pipeline's forward of the same layers, by
deterministic instruction counts on an emulated Cortex-M (issue #38: ubitrain's forward is to
take at most 0.8x CMSIS-NN's instructions).

    python benchmarks/cmsis_nn.py --cmsis-nn PATH [--target cortex-m4] [--layers ...]
                                  [--out results/cmsis_nn.json]

PATH is a CMSIS-NN source tree (github.com/ARM-software/CMSIS-NN, Apache-2.0; not part of
ubitrain). Layers, batch 1: the digits CNN that int8 trains (zoo DigitsCNNNiti, 1x8x8),
LeNet-5's, a MobileNet-style depthwise 3x3 (16 channels, 16x16, stride 1, pad 1) and a
pointwise 1x1 (16->32 on 16x16); ReLU after each but the classifiers; biases where the
network has them.

Counts (the method of benchmarks/icount.py: QEMU `-singlestep -d nochain,exec`, one log line
per instruction, the lines between two `ub_mark` calls):
- CMSIS-NN: its wrappers arm_convolve_wrapper_s8 and arm_depthwise_conv_wrapper_s8 (which
  pick the fastest kernel for the shape and this core) and arm_fully_connected_s8, on random
  int8 data (NHWC) with per-channel multipliers and shifts (per tensor for the fully
  connected layer) that map each channel's largest accumulator near 127, zero offsets, a bias
  always, ReLU as the activation clamp. Built from PATH's Source/ into the micro-kernel
  harness (tools/microkernels/harness.py) with the toolchain and flags of the generated
  project (the target's -mcpu/-mfloat-abi, runtime_c/ub_kernel_flags.cmake's -O2; CMSIS-NN's
  own CMake would use -Ofast). Each output is checked against a numpy model of CMSIS-NN's
  requantization (arm_nn_requantize, double rounding), element for element, before it counts.
- ubitrain: a one-layer model (a depthwise 1x1 conv before it, so that the layer's input
  error is computed; global average pooling after a conv) compiled with precision="int8" for
  the target; its driver runs init and one training step with `ub_mark` around the layer's
  calls in the generated step. The forward is every call from the layer's int8 input to its
  int8 output: the weight's transposes, the conv or matmul, the bias add, the rescale to int8
  (the adaptive site's maximum and shift) and the ReLU. For information, the layer's two
  gradient kernels: the input error (before it is narrowed) and the weight gradient.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from _results import write_json
from icount import marked_spans, step_requests
from torch import nn

import ubitrain as ub
from tools.microkernels import harness
from ubitrain.kernels.c_printer import CKernel
from ubitrain.runtime.target_build import build_driver
from ubitrain.targets import get_target


@dataclass(frozen=True)
class Layer:
    label: str
    kind: str  # "conv", "depthwise" or "fc"
    cin: int
    cout: int
    size: int = 1  # input height = width
    k: int = 1
    pad: int = 0
    bias: bool = False
    relu: bool = True

    @property
    def out_size(self) -> int:
        return self.size + 2 * self.pad - self.k + 1


LAYERS = [
    Layer("digits conv1", "conv", 1, 8, 8, 3, 1),
    Layer("digits conv2", "conv", 8, 16, 4, 3, 1),
    Layer("digits fc", "fc", 256, 10, relu=False),
    Layer("lenet5 conv1", "conv", 1, 6, 32, 5, bias=True),
    Layer("lenet5 conv2", "conv", 6, 16, 14, 5, bias=True),
    Layer("lenet5 fc1", "fc", 400, 120, bias=True),
    Layer("lenet5 fc2", "fc", 120, 84, bias=True),
    Layer("lenet5 fc3", "fc", 84, 10, bias=True, relu=False),
    Layer("mbv dw3x3", "depthwise", 16, 16, 16, 3, 1),
    Layer("mbv pw1x1", "conv", 16, 32, 16, 1),
]

# ---------------------------------------------------------------- CMSIS-NN


def requantize(acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """CMSIS-NN's arm_nn_requantize (without CMSIS_NN_USE_SINGLE_ROUNDING) in int64."""
    v = acc.astype(np.int64) << np.maximum(shift, 0)
    v = ((v * multiplier + (1 << 30)) >> 31).astype(np.int32).astype(np.int64)
    right = np.maximum(-shift, 0)
    mask = (np.int64(1) << right) - 1
    result = v >> right
    threshold = (mask >> 1) + (result < 0)
    return result + ((v & mask) > threshold)


def reference_accumulators(layer: Layer, x, w, bias) -> np.ndarray:
    """int64 sums, NHWC (x: [H, W, Cin]; w as CMSIS-NN lays it out), bias added."""
    if layer.kind == "fc":
        return w.astype(np.int64) @ x.astype(np.int64) + bias
    xp = np.pad(x.astype(np.int64), ((layer.pad,) * 2, (layer.pad,) * 2, (0, 0)))
    n, k = layer.out_size, layer.k
    acc = np.zeros((n, n, layer.cout), np.int64)
    for i in range(k):
        for j in range(k):
            patch = xp[i:i + n, j:j + n, :]  # [n, n, Cin]
            if layer.kind == "depthwise":
                acc += patch * w[0, i, j, :]
            else:
                acc += patch @ w[:, i, j, :].T.astype(np.int64)
    return acc + bias


def quantization(acc: np.ndarray, rng, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers (Q31) and shifts that map each channel's largest |accumulator| to about
    127 (a scale drawn in [0.8, 1.2] of that), as a converter's per-channel scales would."""
    top = np.abs(acc.reshape(-1, acc.shape[-1])).max(axis=0) if per_channel else \
        np.array([np.abs(acc).max()])
    scale = 127.0 / np.maximum(top, 1) * rng.uniform(0.8, 1.2, top.shape)
    mantissa, exponent = np.frexp(scale)
    multiplier = np.round(mantissa * 2.0 ** 31).astype(np.int64)
    exponent = exponent + (multiplier == 2 ** 31)
    multiplier = np.where(multiplier == 2 ** 31, 2 ** 30, multiplier)
    return multiplier, exponent.astype(np.int64)


def cmsis_call(layer: Layer, name: str, scratch: int) -> str:
    """The C function `name`(scratch, x, w, bias, mult, shift, out) calling CMSIS-NN."""
    s, o, k, pad, cin, cout = layer.size, layer.out_size, layer.k, layer.pad, layer.cin, \
        layer.cout
    act = f"{{{0 if layer.relu else -128}, 127}}"
    spatial = f"{{1, 1}}, {{{pad}, {pad}}}, {{1, 1}}, {act}"  # stride, padding, dilation
    per_channel = "cmsis_nn_per_channel_quant_params q = {(int32_t *)mult, (int32_t *)shift};"
    if layer.kind == "conv":
        params = f"cmsis_nn_conv_params p = {{0, 0, {spatial}}};"
        dims = f"in = {{1, {s}, {s}, {cin}}}, f = {{{cout}, {k}, {k}, {cin}}}, " \
               f"o = {{1, {o}, {o}, {cout}}}"
        quant, function = per_channel, "arm_convolve_wrapper_s8"
    elif layer.kind == "depthwise":
        params = f"cmsis_nn_dw_conv_params p = {{0, 0, 1, {spatial}}};"
        dims = f"in = {{1, {s}, {s}, {cin}}}, f = {{1, {k}, {k}, {cout}}}, " \
               f"o = {{1, {o}, {o}, {cout}}}"
        quant, function = per_channel, "arm_depthwise_conv_wrapper_s8"
    else:
        params = f"cmsis_nn_fc_params p = {{0, 0, 0, {act}}};"
        dims = f"in = {{1, 1, 1, {cin}}}, f = {{{cin}, 1, 1, {cout}}}, o = {{1, 1, 1, {cout}}}"
        quant = "cmsis_nn_per_tensor_quant_params q = {mult[0], shift[0]};"
        function = "arm_fully_connected_s8"
    return "\n".join([
        f"int32_t {name}(uint8_t *restrict ub_scratch, const int8_t *x, const int8_t *w, "
        "const int32_t *bias, const int32_t *mult, const int32_t *shift, int8_t *out) {",
        f"    static const {params}",
        f"    const {quant}",
        f"    static const cmsis_nn_dims {dims}, b = {{1, 1, 1, {cout}}};",
        f"    const cmsis_nn_context ctx = {{ub_scratch, {scratch}}};",
        f"    return {function}(&ctx, &p, &q, &in, x, &f, w, &b, bias, &o, out);",
        "}"])


def cmsis_case(n: int, layer: Layer, rng) -> tuple[harness.Case, np.ndarray]:
    """The harness case calling CMSIS-NN's kernel for `layer`, and the output it must give."""
    s = layer.size
    x = rng.integers(-127, 128, (s, s, layer.cin) if layer.kind != "fc" else layer.cin)
    w_shape = {"conv": (layer.cout, layer.k, layer.k, layer.cin),
               "depthwise": (1, layer.k, layer.k, layer.cout),
               "fc": (layer.cout, layer.cin)}[layer.kind]
    w = rng.integers(-127, 128, w_shape)
    bias = rng.integers(-1000, 1001, layer.cout)
    acc = reference_accumulators(layer, x, w, bias)
    mult, shift = quantization(acc, rng, per_channel=layer.kind != "fc")
    lo = 0 if layer.relu else -128
    expected = np.clip(requantize(acc, mult, shift), lo, 127).astype(np.int8)
    scratch = 4 * layer.cin * layer.k * layer.k * 2 + 256  # above every wrapper's need
    name = f"cmsis_layer{n}"
    source = cmsis_call(layer, name, scratch)
    inputs = [x.astype(np.int8), w.astype(np.int8), bias.astype(np.int32),
              mult.astype(np.int32), shift.astype(np.int32)]
    params = [("x", "int8", x.size), ("w", "int8", w.size), ("bias", "int32", bias.size),
               ("mult", "int32", mult.size), ("shift", "int32", shift.size),
               ("out", "int8", expected.size)]
    kernel = CKernel(name, source, params, {5}, scratch)
    return harness.Case(layer.label, [kernel], inputs), expected.reshape(-1)


def cmsis_sources(path: Path) -> list[Path]:
    folders = ("ConvolutionFunctions", "FullyConnectedFunctions", "NNSupportFunctions")
    sources = sorted(f for d in folders for f in (path / "Source" / d).glob("*.c")
                     if not f.stem.endswith(("_f16", "_f32")))  # the float extensions: off
    if not sources:
        raise SystemExit(f"no CMSIS-NN sources under {path}/Source: pass --cmsis-nn the "
                         "root of a CMSIS-NN checkout")
    return sources


def cmsis_counts(layers: list[Layer], path: Path, target, work: Path) -> list[dict]:
    cases, expected = zip(*(cmsis_case(n, layer, np.random.default_rng(LAYERS.index(layer)))
                            for n, layer in enumerate(layers)))  # each layer's data its own
    binary = harness.build(list(cases), {"cmsis": '#include "arm_nnfunctions.h"'}, target,
                           work, sources=tuple(cmsis_sources(path)),
                           includes=(path / "Include",))
    for case, want, ((status, got, _),) in zip(cases, expected,
                                               harness.run(binary, target, list(cases))):
        if status != 0 or not np.array_equal(got, want):
            raise SystemExit(f"CMSIS-NN's {case.label}: status {status}, "
                             f"{int(np.sum(got != want))} of {want.size} outputs differ from "
                             "the numpy reference")
    spans = marked_spans(target, str(binary))
    return [dict(instructions=n, distinct_outputs=len(np.unique(want)))
            for n, want in zip(spans, expected)]

# ---------------------------------------------------------------- ubitrain


class OneLayer(nn.Module):
    """`layer` after a depthwise 1x1 conv (so that its input error is computed), its ReLU,
    and for a conv a global average: the logits."""

    def __init__(self, layer: Layer):
        super().__init__()
        self.pre = nn.Conv2d(layer.cin, layer.cin, 1, groups=layer.cin, bias=False)
        if layer.kind == "fc":
            self.layer = nn.Linear(layer.cin, layer.cout, bias=layer.bias)
        else:
            self.layer = nn.Conv2d(layer.cin, layer.cout, layer.k, padding=layer.pad,
                                   bias=layer.bias,
                                   groups=layer.cin if layer.kind == "depthwise" else 1)
        self.relu = layer.relu
        self.kind = layer.kind

    def forward(self, x):
        x = self.pre(x)
        y = self.layer(torch.flatten(x, 1) if self.kind == "fc" else x)
        y = torch.relu(y) if self.relu else y
        return y if self.kind == "fc" else torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)


def layer_calls(calls, weight: str) -> dict[str, list[int]]:
    """Indices into the step's `calls` of the layer whose weight is `weight`: its forward
    calls, its input error's kernel and its weight gradient's kernel."""
    def roots(slots):
        return {s.root.name for s in slots}

    def written(c):
        return roots(c.args[i] for i in c.outputs)

    loss = next(i for i, c in enumerate(calls) if "softmax_xent" in c.kernel)
    w = {s.root.name for c in calls for s in c.args if s.label == weight}
    weights, forward, at = set(w), [], None
    for i, c in enumerate(calls[:loss]):  # the weight's copies (transposed), then the product
        if not c.builtin and roots(c.reads) & weights:
            forward.append(i)
            if c.args[c.outputs[0]].dtype == "int8":
                weights |= written(c)
                continue
            at = i
            break
    current, narrowed = written(calls[at]), False
    for i in range(at + 1, loss):  # the bias add, the rescale to int8, the ReLU
        c = calls[i]
        if c.builtin or not roots(c.reads) & current:
            continue
        if narrowed:
            if "maximum" in c.kernel:
                forward.append(i)
            break
        forward.append(i)
        current = written(c)
        narrowed = c.args[c.outputs[0]].dtype == "int8"
    input_error = next(i for i in range(loss, len(calls)) if not calls[i].builtin
                       and roots(calls[i].reads) & weights
                       and calls[i].args[calls[i].outputs[0]].dtype == "int32")
    update = next(i for i, c in enumerate(calls) if "niti_update" in c.kernel
                  and written(c) & w)
    gradient = roots(s for s in calls[update].reads if s.dtype == "int32")
    weight_gradient = max(i for i in range(update) if written(calls[i]) & gradient)
    return {"forward": forward, "input_error": [input_error],
            "weight_gradient": [weight_gradient]}


CALL_LINE = re.compile(r"^(\s*)(UB_TRY\((\w+)\(.*\);)$")


def mark_calls(model_c: Path, step: str, calls, picked: list[int]) -> None:
    """Put `ub_mark()` around the picked calls of the step function `step` in model.c."""
    lines = model_c.read_text().split("\n")
    begin = next(n for n, line in enumerate(lines) if line.startswith(f"int32_t {step}("))
    kernels = [(i, c.kernel) for i, c in enumerate(calls) if not c.builtin]
    at = 0
    for n in range(begin, len(lines)):
        if lines[n] == "}":
            break
        m = CALL_LINE.match(lines[n])
        if m and at < len(kernels) and m.group(3) == kernels[at][1]:
            if kernels[at][0] in picked:
                lines[n] = f"{m.group(1)}ub_mark(); {m.group(2)} ub_mark();"
            at += 1
    if at != len(kernels):
        raise SystemExit(f"{model_c}: found {at} of the step's {len(kernels)} kernel calls")
    first = next(n for n, line in enumerate(lines) if line.startswith("/* ---- kernels"))
    lines.insert(first, "__attribute__((noinline)) void ub_mark(void) "
                 '{ __asm__ volatile("" ::: "memory"); }')
    model_c.write_text("\n".join(lines))


def ubitrain_counts(layer: Layer, target, work: Path) -> dict:
    torch.manual_seed(0)
    shape = (1, layer.cin, 1, 1) if layer.kind == "fc" else (1, layer.cin, layer.size,
                                                               layer.size)
    x, y = torch.randn(shape), torch.tensor([1])
    out = work / re.sub(r"\W+", "_", layer.label)
    pkg = ub.compile(OneLayer(layer), (x,), y, precision="int8", target=target.name,
                     optimizer=ub.NITI(mu=(5,), milestones=()), out_dir=out, name="layer")
    calls = pkg.programs["train_step"].calls
    roles = layer_calls(calls, "layer.weight")
    picked = sorted(i for ids in roles.values() for i in ids)
    mark_calls(out / "model.c", "ub_layer_train_step", calls, picked)
    binary = build_driver(out, pkg.model_name, target)
    spans = dict(zip(picked, marked_spans(target, str(binary), step_requests(
        pkg, 1, x.numpy(), y.numpy().astype(pkg.labels.dtype)))))
    return {role: [(calls[i].kernel, spans[i]) for i in ids] for role, ids in roles.items()}

# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cmsis-nn", required=True, type=Path, help="CMSIS-NN source tree")
    parser.add_argument("--target", default="cortex-m4", choices=["cortex-m4", "cortex-m7"])
    parser.add_argument("--layers", nargs="*", help="labels of LAYERS to measure (default all)")
    parser.add_argument("--out", default="results/cmsis_nn.json")
    args = parser.parse_args(argv)
    target = get_target(args.target)
    layers = [x for x in LAYERS if not args.layers or x.label in args.layers]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ub_cmsis_nn_") as tmp:
        cmsis = cmsis_counts(layers, args.cmsis_nn.resolve(), target, Path(tmp) / "cmsis")
        for layer, c in zip(layers, cmsis):
            ours = ubitrain_counts(layer, target, Path(tmp))
            forward = sum(n for _, n in ours["forward"])
            rows.append(dict(layer=layer.label, shape=shape_text(layer),
                             cmsis_nn_instructions=c["instructions"],
                             cmsis_nn_distinct_outputs=c["distinct_outputs"],
                             ubitrain_forward_instructions=forward,
                             ratio=round(forward / c["instructions"], 2),
                             ubitrain_forward_kernels=ours["forward"],
                             input_error_instructions=ours["input_error"][0][1],
                             weight_gradient_instructions=ours["weight_gradient"][0][1]))
            print_row(rows[-1], header=len(rows) == 1)
    write_json(args.out, {"target": args.target, "cmsis_nn": str(args.cmsis_nn),
                          "method": "qemu -singlestep -d nochain,exec: one log line per "
                                    "instruction, between ub_mark calls", "batch": 1,
                          "goal": "ubitrain forward <= 0.8x CMSIS-NN", "layers": rows})
    return 0


def shape_text(layer: Layer) -> str:
    if layer.kind == "fc":
        return f"fc {layer.cin}->{layer.cout}"
    k = f"{layer.k}x{layer.k}{' dw' if layer.kind == 'depthwise' else ''}"
    return f"{layer.cin}x{layer.size}x{layer.size} {k} ->{layer.cout}" + \
        (f" pad {layer.pad}" if layer.pad else "")


def print_row(r: dict, header: bool) -> None:
    if header:
        print(f"{'layer':<13} {'shape':<24} {'CMSIS-NN':>10} {'ubitrain':>10} {'ratio':>6} "
              f"{'dX':>10} {'dW':>10}   (instructions; goal: ratio <= 0.8)")
    print(f"{r['layer']:<13} {r['shape']:<24} {r['cmsis_nn_instructions']:>10,} "
          f"{r['ubitrain_forward_instructions']:>10,} {r['ratio']:>6.2f} "
          f"{r['input_error_instructions']:>10,} {r['weight_gradient_instructions']:>10,}",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
