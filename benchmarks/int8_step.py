"""The INT8 (NITI) training step against the fp32 step: instructions per step on the emulated
targets and the arena, side by side, reported as ratios; plus what self-adaptive rescaling
saves (instructions, share of shift reductions skipped).

    python benchmarks/int8_step.py [--targets aarch64-neon hexagon-v66] [--batch 4]
                                   [--steps 4] [--out results/int8_step.json]

Model: zoo "digits_cnn_niti" (the demo's CNN without BatchNorm and biases, which NITI has no
integer form for), the same network in both precisions; fp32 with SGD + momentum, int8 with
NITI's update.

Instruction counts use the method of benchmarks/icount.py: QEMU with `-singlestep -d
nochain,exec` logs one line per retired instruction (Hexagon: per packet); the driver program
runs init and K training steps, then init and 2K steps on the same batch, and the per-step
count is the difference divided by K. Averaging over K steps includes the steps on which an
adaptive site skips its reduction (the first step of a site always reduces).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import ubitrain as ub
from ubitrain.runtime.target_build import build_driver
from ubitrain.targets import get_target
from ubitrain.zoo import ZOO


def traced_count(target, binary: str, stdin: bytes) -> int:
    read, write = os.pipe()
    cmd = target.emulator_command(binary)
    qemu = subprocess.Popen([cmd[0], "-singlestep", "-d", "nochain,exec", "-D",
                             f"/dev/fd/{write}", *cmd[1:]], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            pass_fds=(write,))
    os.close(write)
    count = subprocess.Popen(["wc", "-l"], stdin=read, stdout=subprocess.PIPE)
    os.close(read)
    _, err = qemu.communicate(stdin)
    lines = int(count.communicate()[0])
    if qemu.returncode != 0:
        raise RuntimeError(f"{binary}: status {qemu.returncode}: {err.decode()[-800:]}")
    return lines


def requests(steps: int, x: np.ndarray, y: np.ndarray) -> bytes:
    req = b"I\0\0\0" + struct.pack("<Q", 0)
    for _ in range(steps):
        req += b"T\0\0\0" + x.tobytes() + y.tobytes()
    return req + b"Q\0\0\0"


def measure(target, pkg, x, y, steps: int) -> float:
    binary = str(build_driver(Path(pkg.out_dir), pkg.model_name, target).resolve())
    xs, ys = x.numpy().astype(np.float32), y.numpy().astype(pkg.labels.dtype)
    one, two = (traced_count(target, binary, requests(n, xs, ys)) for n in (steps, 2 * steps))
    return (two - one) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", nargs="+", default=["aarch64-neon", "hexagon-v66"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="K: steps averaged per count")
    parser.add_argument("--out", default="results/int8_step.json")
    args = parser.parse_args(argv)
    entry = ZOO["digits_cnn_niti"]
    torch.manual_seed(0)
    model = entry.factory()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((args.batch,) + entry.sample_shape, generator=gen)
    y = torch.randint(0, entry.classes, (args.batch,), generator=gen)
    configs = {
        "fp32": dict(optimizer=ub.SGD(lr=0.05, momentum=0.9)),
        "int8": dict(precision="int8", optimizer=ub.NITI(mu=(5,), milestones=())),
        "int8_adaptive": dict(precision="int8", optimizer=ub.NITI(
            mu=(5,), milestones=(), adaptive_rescale=True)),
    }
    results = {"model": "digits_cnn_niti", "batch": args.batch, "steps_averaged": args.steps,
               "method": "qemu -singlestep -d nochain,exec: one log line per instruction "
                         "(Hexagon: per packet)", "targets": {}}
    with tempfile.TemporaryDirectory(prefix="ub_int8_step_") as tmp:
        for name in args.targets:
            target = get_target(name)
            rows = {}
            for key, options in configs.items():
                pkg = ub.compile(model, (x,), y, target=name, out_dir=Path(tmp) / name / key,
                                 **options)
                rows[key] = {"instructions_per_step": measure(target, pkg, x, y, args.steps),
                             "arena_bytes": pkg.memory_plan.arena_bytes}
            f, i8, ad = rows["fp32"], rows["int8"], rows["int8_adaptive"]
            rows["fp32_over_int8_instructions"] = round(
                f["instructions_per_step"] / i8["instructions_per_step"], 3)
            rows["int8_over_adaptive_instructions"] = round(
                i8["instructions_per_step"] / ad["instructions_per_step"], 3)
            rows["fp32_over_int8_arena"] = round(f["arena_bytes"] / i8["arena_bytes"], 3)
            results["targets"][name] = rows
            print(f"{name}: instructions per training step (batch {args.batch}, mean of "
                  f"{args.steps}): fp32 {f['instructions_per_step']:,.0f}, int8 "
                  f"{i8['instructions_per_step']:,.0f}, int8 adaptive "
                  f"{ad['instructions_per_step']:,.0f} | fp32/int8 "
                  f"{rows['fp32_over_int8_instructions']:.2f}x, int8/adaptive "
                  f"{rows['int8_over_adaptive_instructions']:.3f}x | arena fp32 "
                  f"{f['arena_bytes']:,} B, int8 {i8['arena_bytes']:,} B "
                  f"({rows['fp32_over_int8_arena']:.2f}x)")
            sys.stdout.flush()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
