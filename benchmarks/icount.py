"""Deterministic instruction counts of the kernels and of one training step, scalar against
micro-kernel (intrinsic) variants, on the emulated targets.

    python benchmarks/icount.py [--targets aarch64-neon ...] [--models digits_cnn lenet5]
                                [--batch 4] [--kernel-batch 1] [--out results/icount.json]

The tracing emulator retires about half a million instructions a second, so the defaults are
small: the kernels of the lenet5 and digits_cnn layers at batch 1, one training step of
digits_cnn at batch 4 (a scalar lenet5 step at batch 4 is about 10^8 instructions).

Method (the same for every target, no wall time): QEMU runs the program with `-singlestep`
(one guest instruction per translation block; on Hexagon one packet) and `-d nochain,exec`
(one log line per executed block, chaining off so that none is skipped), the log going to a
pipe. So the log has exactly one line per retired instruction (Hexagon: per packet).
- Per kernel: tools/microkernels/harness.py builds one program with every kernel variant;
  it calls the empty function `ub_mark` right before and after each kernel call. The count of
  a kernel is the number of log lines between the two `ub_mark` lines (it includes the
  handful of instructions of the call itself).
- Per training step: the model's own driver program (driver.c) runs `init` and then one, or
  two, training steps on the same batch; the step's count is the difference of the two runs'
  line counts (it includes reading one batch from the driver's input).
The step's baseline is the same compile with micro-kernels switched off (plain C, built as
the project builds it).

Two scalar baselines per kernel, because the scalar variant is compiled as the project compiles
it (-O3 on AArch64), and GCC's vectoriser then turns the plain-C kernel into NEON code itself:
- `scalar`: the plain-C variant with the vectoriser off for it (`optimize("no-tree-vectorize")`,
  everything else as built): scalar code, what the goal compares with;
- `autovec`: the same variant as shipped, vectorised by GCC where it can.
On Cortex-M (no float SIMD) both are the same code.

Cross-check on Cortex-M (the method docs/toolchains.md gives): the same kernel program runs again
under `qemu-system-arm -icount shift=0`, where virtual time advances one nanosecond per
instruction, and reads SysTick (on the 25 MHz processor clock of the MPS2 boards) around every
call: ticks x 40 ns must equal the log's count to within a tick or two.

The ratios reported are scalar (and autovec) instructions / micro-kernel instructions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from tools.microkernels import harness
from tools.microkernels.cases import batch_norm_funcs, conv2d_funcs, matmul_funcs
from ubitrain.kernels.c_printer import CKernel
from ubitrain.kernels.library import KernelLibrary
from ubitrain.ops.tagging import op_info
from ubitrain.runtime.target_build import build_driver
from ubitrain.targets import TARGETS, get_target
from ubitrain.zoo import ZOO

# The conv and linear layers of lenet5 and digits_cnn, and a depthwise layer and a BatchNorm
# of mobilenetv2_small: (label, funcs at a batch size and reduction accumulator type).
LAYERS = [
    ("lenet5 conv1", lambda b, acc: conv2d_funcs((b, 1, 32, 32), (6, 1, 5, 5))),
    ("lenet5 conv2", lambda b, acc: conv2d_funcs((b, 6, 14, 14), (16, 6, 5, 5))),
    ("lenet5 fc1", lambda b, acc: matmul_funcs(b, 400, 120)),
    ("digits conv1", lambda b, acc: conv2d_funcs((b, 1, 8, 8), (8, 1, 3, 3), padding=(1, 1))),
    ("digits conv2", lambda b, acc: conv2d_funcs((b, 8, 4, 4), (16, 8, 3, 3), padding=(1, 1))),
    ("mbv2 dw3x3", lambda b, acc: conv2d_funcs((b, 32, 8, 8), (32, 1, 3, 3), padding=(1, 1),
                                               groups=32)),  # mobilenetv2_small's block 3
    ("mbv2 BatchNorm", lambda b, acc: batch_norm_funcs((b, 32, 8, 8), acc)),  # its BN there
]


def traced(target, binary: str, log_fd: int) -> list[str]:
    """The emulator command of `target` with one log line per executed instruction."""
    cmd = [binary] if target.runs_on_host else target.emulator_command(binary)
    return [cmd[0], "-singlestep", "-d", "nochain,exec", "-D", f"/dev/fd/{log_fd}", *cmd[1:]]


def run_traced(target, binary: str, counter: list[str], stdin: bytes = b"") -> str:
    """Run under the tracing emulator; the log goes through `counter` (grep, wc)."""
    read, write = os.pipe()
    qemu = subprocess.Popen(traced(target, binary, write), stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            pass_fds=(write,))
    os.close(write)
    count = subprocess.Popen(counter, stdin=read, stdout=subprocess.PIPE)
    os.close(read)
    # The counter's output is drained while the emulator runs: a counter that writes more
    # than a pipe holds (grep over many kernels) would otherwise block it, and the emulator.
    counted = []
    reader = threading.Thread(target=lambda: counted.append(count.stdout.read()))
    reader.start()
    _, err = qemu.communicate(stdin)
    reader.join()
    count.wait()
    out = counted[0].decode()
    if qemu.returncode != 0:
        raise RuntimeError(f"{binary} under {target.name}: status {qemu.returncode}: "
                           f"{err.decode(errors='replace')[-1000:]}")
    return out


def marked_spans(target, binary: str, stdin: bytes = b"") -> list[int]:
    """Instructions between each pair of `ub_mark` calls, in the order the program runs
    them (each pair brackets one call: its count includes the call's own instructions)."""
    marks = run_traced(target, binary, ["grep", "-n", "-E", " ub_mark$"], stdin)
    lines = [int(line.split(":")[0]) for line in marks.splitlines()]
    return [b - a - 1 for a, b in zip(lines[0::2], lines[1::2])]


MPS2_NS_PER_TICK = 1e9 / 25e6  # SysTick on the processor clock of mps2-an386/an500


def kernel_counts(target, batch: int, work: Path) -> list[dict]:
    isa = target.kernel_isa("float32")
    cases, support, labels, seen = [], {}, [], set()
    for layer, make in LAYERS:
        for func in make(batch, target.accumulate_dtype):
            if str(func.attrs["ub_op"]) in seen:  # the forward conv of main and main_adjoint
                continue
            seen.add(str(func.attrs["ub_op"]))
            scalar = KernelLibrary("scalar").add(func, "k")
            lib = KernelLibrary(isa)
            micro = lib.add(func, "k")
            if micro.name.endswith("__scalar"):
                continue
            support.update(lib.support)
            inputs = [np.ones(shape, np.float32) for shape in op_info(func)["shapes"]]
            novec = compiled_with(scalar, "novec", "no-tree-vectorize")
            cases.append(harness.Case(layer, [novec, scalar, micro], inputs))
            labels.append((layer, micro.name.split("_ukernel_")[0].removeprefix("ub_f32_"),
                           op_info(func)["shapes"]))
    binary = harness.build(cases, support, target, work)
    spans = marked_spans(target, str(binary))
    ticks = None
    if target.board is not None:  # Cortex-M: SysTick under -icount shift=0, the cross-check
        timed = harness.run(binary, target, cases, emulator_options=("-icount", "shift=0"))
        ticks = [[t for _, _, t in per_case] for per_case in timed]
    rows = []
    for n, ((layer, kernel, shapes), case, (s, a, m)) in enumerate(
            zip(labels, cases, zip(spans[0::3], spans[1::3], spans[2::3]))):
        row = dict(layer=layer, kernel=kernel, shapes=shapes, micro=case.variants[2].name,
                   scalar_instructions=s, autovec_instructions=a, micro_instructions=m,
                   ratio=round(s / m, 2), autovec_ratio=round(a / m, 2))
        if ticks is not None:
            row["systick_scalar_instructions"] = round(ticks[n][0] * MPS2_NS_PER_TICK)
            row["systick_micro_instructions"] = round(ticks[n][2] * MPS2_NS_PER_TICK)
        rows.append(row)
    return rows


def compiled_with(kernel: CKernel, suffix: str, option: str | None) -> CKernel:
    """The kernel renamed with `suffix`, built with GCC's function attribute
    `optimize(option)` on top of the build's flags (as is where option is None)."""
    name = f"{kernel.name}_{suffix.replace('-', '_')}"
    source = kernel.source.replace(kernel.name, name)
    if option:
        source = f'__attribute__((optimize("{option}")))\n{source}'
    return dataclasses.replace(kernel, name=name, source=source)


def step_requests(pkg, steps: int, x: np.ndarray, y: np.ndarray) -> bytes:
    req = b"I\0\0\0" + struct.pack("<Q", 0)
    for _ in range(steps):
        req += b"T\0\0\0" + x.tobytes() + y.tobytes()
    return req + b"Q\0\0\0"


def step_count(model_name: str, target, batch: int, work: Path, scalar: bool) -> int:
    entry = ZOO[model_name]
    torch.manual_seed(0)
    model = entry.factory()
    x = torch.randn((batch,) + entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    isa = "scalar" if scalar else target.kernel_isa("float32")
    pkg = ub.compile(model, (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                     target=target.name, out_dir=work / f"{model_name}_{isa}",
                     disable_passes=("microkernels",) if scalar else ())
    binary = str(build_driver(Path(pkg.out_dir), pkg.model_name, target).resolve())
    xs, ys = x.numpy().astype(np.float32), y.numpy().astype(pkg.labels.dtype)
    counts = [int(run_traced(target, binary, ["wc", "-l"], step_requests(pkg, n, xs, ys)))
              for n in (1, 2)]
    return counts[1] - counts[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    with_micro = [n for n, t in TARGETS.items()
                  if t.kernel_isa("float32") != "scalar" and not t.runs_on_host]
    parser.add_argument("--targets", nargs="+", default=with_micro)
    parser.add_argument("--models", nargs="*", default=["digits_cnn"])
    parser.add_argument("--batch", type=int, default=4, help="batch of the training steps")
    parser.add_argument("--kernel-batch", type=int, default=4, help="batch of the kernels")
    parser.add_argument("--out", default="results/icount.json")
    args = parser.parse_args(argv)
    results = {"method": "qemu -singlestep -d nochain,exec: one log line per instruction",
               "batch": args.batch, "kernel_batch": args.kernel_batch, "targets": {}}
    with tempfile.TemporaryDirectory(prefix="ub_icount_") as tmp:
        for name in args.targets:
            target = get_target(name)
            isa = target.kernel_isa("float32")
            rows = kernel_counts(target, args.kernel_batch, Path(tmp) / f"kernels_{name}")
            print(f"\n{name}: instructions per kernel call, scalar vs {isa}")
            print(f"{'layer':<14} {'kernel':<22} {'scalar':>11} {'autovec':>11} "
                  f"{isa:>11} {'ratio':>7} {'autovec':>7}")
            for r in rows:
                timer = ""
                if "systick_scalar_instructions" in r:
                    timer = (f"   (SysTick x 40 ns: {r['systick_scalar_instructions']:,} / "
                             f"{r['systick_micro_instructions']:,})")
                print(f"{r['layer']:<14} {r['kernel']:<22} {r['scalar_instructions']:>11,} "
                      f"{r['autovec_instructions']:>11,} {r['micro_instructions']:>11,} "
                      f"{r['ratio']:>6.2f}x {r['autovec_ratio']:>6.2f}x{timer}")
            steps = []
            for model in args.models:
                s = step_count(model, target, args.batch, Path(tmp), scalar=True)
                m = step_count(model, target, args.batch, Path(tmp), scalar=False)
                steps.append(dict(model=model, plain_c_instructions=s, micro_instructions=m,
                                  ratio=round(s / m, 2)))
                print(f"training step {model:<12} plain C (as built) {s:>12,}  {isa} "
                      f"{m:>12,}  {s / m:.2f}x")
            results["targets"][name] = {"isa": isa, "kernels": rows, "steps": steps}
            sys.stdout.flush()
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
