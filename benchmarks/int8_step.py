"""The INT8 (NITI) training step against the fp32 step: instructions per step on the emulated
targets and the arena, side by side, reported as ratios; plus what self-adaptive rescaling
saves (instructions, share of shift reductions skipped).

    python benchmarks/int8_step.py [--targets aarch64-neon hexagon-v66] [--batch 4]
                                   [--steps 4] [--out results/int8_step.json] [--no-split]

Model: zoo "digits_cnn_niti" (the demo's CNN without BatchNorm and biases, which NITI has no
integer form for), the same network in both precisions; fp32 with SGD + momentum, int8 with
NITI's update.

Instruction counts use the method of benchmarks/icount.py: QEMU with `-singlestep -d
nochain,exec` logs one line per retired instruction (Hexagon: per packet); the driver program
runs init and K training steps, then init and 2K steps on the same batch, and the per-step
count is the difference divided by K. Averaging over K steps includes the steps on which an
adaptive site skips its reduction (the first step of a site always reduces).

The int8 step's kernels are printed plain C (pipeline/int8.py), on both sides of the split.

The DSP/CPU split (hexagon-v66, NITI(dsp_offload=True, cpu_target="aarch64-neon")): the CPU
part runs as a driver under qemu-aarch64, the DSP part under qemu-hexagon, joined by FIFOs
(offload/trainer.py). Both emulators trace at once, so one run gives the instructions of
the CPU part and the packets of the DSP part; the per-step count is again the difference of
K and 2K steps. Transfers are the bytes each step's invocations send and receive (the pipe
protocol of runtime_c/ub_offload_pipe.h: headers, IN buffers; status, OUT buffers). They are
compared with the whole int8 step on the CPU (aarch64-neon) and on the DSP (hexagon-v66).
The schedule says which CPU kernels run while the DSP works on each segment (offload/overlap.py);
the counts are per processor, so they do not show the time the overlap saves.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from ubitrain.offload import overlap
from ubitrain.offload.trainer import build_emulated_split, start_dsp
from ubitrain.runtime.target_build import build_driver
from ubitrain.targets import get_target
from ubitrain.zoo import ZOO

TRACE = ("-singlestep", "-d", "nochain,exec")


def line_counter():
    """(fd a QEMU writes its log to, the `wc -l` process counting the lines)."""
    read, write = os.pipe()
    count = subprocess.Popen(["wc", "-l"], stdin=read, stdout=subprocess.PIPE)
    os.close(read)
    return write, count


def traced_count(target, binary: str, stdin: bytes, args: tuple[str, ...] = ()) -> int:
    write, count = line_counter()
    cmd = target.emulator_command(binary)
    qemu = subprocess.Popen([cmd[0], *TRACE, "-D", f"/dev/fd/{write}", *cmd[1:], *args],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, pass_fds=(write,))
    os.close(write)
    _, err = qemu.communicate(stdin)
    lines = int(count.communicate()[0])
    if qemu.returncode != 0:
        raise RuntimeError(f"{binary}: status {qemu.returncode}: {err.decode()[-800:]}")
    return lines


def traced_split(cpu, cpu_binary, dsp_binary, stdin: bytes) -> tuple[int, int]:
    """(CPU part instructions, DSP part packets) of one run, both emulators tracing."""
    write, count = line_counter()
    dsp, fifo_dir, to_dsp, from_dsp = start_dsp(get_target("hexagon-v66"), dsp_binary,
                                                (*TRACE, "-D", f"/dev/fd/{write}"),
                                                pass_fds=(write,))
    os.close(write)
    try:
        cpu_lines = traced_count(cpu, str(cpu_binary), stdin, (to_dsp, from_dsp))
        dsp.wait(timeout=600)
    finally:
        if dsp.poll() is None:
            dsp.kill()
        subprocess.run(["rm", "-rf", fifo_dir], check=False)
    return cpu_lines, int(count.communicate()[0])


def transfers(pkg) -> dict:
    """Bytes a step sends to the DSP and receives from it (ub_offload_pipe.h's protocol)."""
    plan, sent, received = pkg.memory_plan, 0, 0
    for seg in pkg.segments:
        buffers = seg.buffers(plan)
        sent += 8 + sum(8 + (b["bytes"] if b["flags"] & 1 else 0) for b in buffers)
        received += 4 + sum(b["bytes"] for b in buffers if b["flags"] & 2)
    return {"invocations": len(pkg.segments), "bytes_to_dsp": sent, "bytes_from_dsp": received}


def measure_split(pkg, x, y, steps: int) -> dict:
    cpu, cpu_binary, dsp_binary = build_emulated_split(pkg)
    xs, ys = x.numpy().astype(np.float32), y.numpy().astype(pkg.labels.dtype)
    (c1, d1), (c2, d2) = (traced_split(cpu, cpu_binary, dsp_binary, requests(n, xs, ys))
                          for n in (steps, 2 * steps))
    return {"cpu_part_instructions_per_step": (c2 - c1) / steps,
            "dsp_part_packets_per_step": (d2 - d1) / steps,
            "dsp_kernels": [p.kernel for p in pkg.placement if p.where == "dsp"], **transfers(pkg)}


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
    parser.add_argument("--no-split", dest="split", action="store_false",
                        help="skip the DSP/CPU split measurement")
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
        if args.split:
            pkg = ub.compile(model, (x,), y, target="hexagon-v66", out_dir=Path(tmp) / "split",
                             precision="int8", optimizer=ub.NITI(
                                 mu=(5,), milestones=(), dsp_offload=True,
                                 cpu_target="aarch64-neon"))
            split = measure_split(pkg, x, y, args.steps)
            split["overlap"] = overlap.report(pkg.overlaps).splitlines()
            whole = results["targets"]
            for name in ("aarch64-neon", "hexagon-v66"):
                if name in whole:
                    split[f"{name}_int8_step"] = whole[name]["int8"]["instructions_per_step"]
            results["dsp_cpu_split"] = split
            print(f"split (CPU part on aarch64-neon, DSP part on hexagon-v66): CPU part "
                  f"{split['cpu_part_instructions_per_step']:,.0f} instructions, DSP part "
                  f"{split['dsp_part_packets_per_step']:,.0f} packets per step; "
                  f"{split['invocations']} invocation(s), {split['bytes_to_dsp']:,} B to and "
                  f"{split['bytes_from_dsp']:,} B from the DSP per step; DSP kernels: "
                  f"{', '.join(split['dsp_kernels'])}" + "".join(
                      f"; whole int8 step on {n}: {split[n + '_int8_step']:,.0f}"
                      for n in ("aarch64-neon", "hexagon-v66") if n + "_int8_step" in split))
            print("\n".join(split["overlap"]))
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
