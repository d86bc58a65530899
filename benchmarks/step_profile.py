"""Where one training step's time goes, kernel call by kernel call, on an x86-64 host.

    python benchmarks/step_profile.py [--model mobilenetv2_small] [--batch 32] [--steps 300]
                                      [--top 30] [--out results/step_profile.json]

The host package of a zoo model is compiled, and before it is built, every kernel call of
its `train_step` in model.c is wrapped in a pair of `__rdtsc()` reads that add the call's
cycles to a counter of its own (a few cycles each). After warm-up, `--steps` steps run and
each call's mean time in the step is printed with its share. Then each conv and GEMM kernel
(their outputs never overlap their inputs) runs again on its own, 30 times, on the arena as
the last step left it: the best of those is its time with operands hot in cache. A kernel
as slow alone as in the step is bound by its arithmetic; one much faster alone waits on
memory in the step (operands saved early in the forward come back from DRAM).

The timestamp counter's rate is found from the steps' wall time, so the microseconds hold
on a machine whose clock moves. Run it on an idle machine: the shares, not the times, are
what compares across runs.
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from ubitrain.zoo import ZOO

CALL = re.compile(r"UB_TRY\((ub_\w+\(.*?\))\);")
# kernels that write only their outputs: safe to run again alone on the step's arena
REPLAYABLE = ("conv2d", "gemm", "matmul")
PROFILE_C = """
#include <x86intrin.h>
unsigned long long ub_profile_cycles[{n}];
#define UB_TIMED(i, e) do {{ const unsigned long long t0_ = __rdtsc(); const int32_t s_ = (e); \\
    ub_profile_cycles[i] += __rdtsc() - t0_; if (s_ != UB_OK) return s_; }} while (0)
"""


def instrument(model_c: Path) -> list[str]:
    """Wrap every kernel call of train_step in model.c; add `<step>_replay(i, ...)`, which
    runs call i alone. Returns the kernel names, in call order."""
    src = model_c.read_text()
    start = src.index("_train_step(ub_")
    head = src.rfind("\n", 0, start) + 1
    body = src.index("{", start)
    end = src.index("\n}\n", body)
    calls = CALL.findall(src[body:end])
    counter = iter(range(len(calls)))
    timed = CALL.sub(lambda m: f"UB_TIMED({next(counter)}, {m.group(1)});", src[body:end])
    cases = "".join(f"    case {i}: return {c};\n" for i, c in enumerate(calls))
    replay = (src[head:body].replace("_train_step(", "_replay(int32_t which, ")
              + "{\n    uint8_t *const A = ctx->arena;\n    (void)x; (void)labels; (void)loss;\n"
              f"    switch (which) {{\n{cases}    }}\n    return UB_OK;\n}}\n")
    model_c.write_text(src[:head] + PROFILE_C.format(n=len(calls)) + src[head:body] + timed
                       + src[end:end + 3] + replay + src[end + 3:])
    return [c.split("(")[0] for c in calls]


def profile(name: str, batch: int, steps: int, out_dir: Path) -> dict:
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    pkg = ub.compile(entry.factory(), (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                     out_dir=out_dir / name)
    kernels = instrument(pkg.out_dir / "model.c")
    trainer = pkg.build()
    step = trainer.bound_step(x.numpy(), y.numpy())
    for _ in range(20):
        step()
    cycles = (ctypes.c_ulonglong * len(kernels)).in_dll(trainer.lib, "ub_profile_cycles")
    ctypes.memset(cycles, 0, ctypes.sizeof(cycles))
    start = time.perf_counter()
    for _ in range(steps):
        step()
    step_s = (time.perf_counter() - start) / steps
    per_call = np.array(cycles[:], dtype=np.float64) / steps
    hz = per_call.sum() / step_s  # the calls are nearly all of the step

    replay = getattr(trainer.lib, f"ub_{pkg.model_name}_replay")
    replay.argtypes = [ctypes.c_int32, ctypes.c_void_p] + [ctypes.c_void_p] * 3
    xs, ys, loss = x.numpy().copy(), y.numpy().astype(np.int32), ctypes.c_float()
    args = (ctypes.addressof(trainer.ctx), xs.ctypes.data, ys.ctypes.data,
            ctypes.addressof(loss))
    alone = []
    for i, kernel in enumerate(kernels):
        if not any(k in kernel for k in REPLAYABLE):
            alone.append(None)
            continue
        best = float("inf")
        for _ in range(33):
            t = time.perf_counter()
            replay(i, *args)
            best = min(best, time.perf_counter() - t)
        alone.append(best * 1e6)
    rows = [dict(call=i, kernel=k, step_us=c / hz * 1e6, share=c / per_call.sum(), alone_us=a)
            for i, (k, c, a) in enumerate(zip(kernels, per_call, alone))]
    return dict(model=name, batch=batch, steps=steps, step_ms=step_s * 1e3, rows=rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2_small", choices=list(ZOO))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("results/step_profile.json"))
    args = parser.parse_args()
    if platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit("step_profile.py reads the x86 timestamp counter: run it on x86-64")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = profile(args.model, args.batch, args.steps, Path(tmp))
    print(f"{args.model} b{args.batch}: {result['step_ms']:.3f} ms a step; the slowest calls:")
    print(f"{'call':>4} {'in step us':>10} {'share':>6} {'alone us':>8}  kernel")
    for r in sorted(result["rows"], key=lambda r: -r["step_us"])[:args.top]:
        alone = "" if r["alone_us"] is None else f"{r['alone_us']:.1f}"
        print(f"{r['call']:4d} {r['step_us']:10.1f} {100 * r['share']:5.1f}% {alone:>8}  "
              f"{r['kernel']}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
