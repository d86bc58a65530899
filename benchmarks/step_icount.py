"""Instructions of one training step on the host, kernel by kernel, counted by callgrind.

    python benchmarks/step_icount.py [--model mobilenetv2_small] [--batch 32] [--steps 3]
                                     [--top 25] [--out results/step_icount.json]

A zoo model's host package is compiled and built by its own CMake project (the flags of
every host build), and a small main() linked with it runs `--steps` training steps on one
batch. valgrind's callgrind counts the instructions each kernel retires
(inclusive of the micro-kernel cores it calls) per step.
Unlike a time, the count is the same on a busy machine and a quiet one, so two commits
compare to the instruction; on this x86-64 host the step's time follows it (a kernel's time
fitted to its instructions and its L2 misses put most of it on the instructions).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import torch
from _results import write_json

import ubitrain as ub
from ubitrain.runtime.build import cmake_build
from ubitrain.zoo import ZOO

MAIN_C = """#include <stdlib.h>
#include "model.h"
static uint8_t arena[UB_{M}_ARENA_BYTES] __attribute__((aligned(64)));
static float x[UB_{M}_INPUT0_ELEMENTS];
static int32_t labels[UB_{M}_BATCH];
int main(int argc, char **argv) {{
    ub_{m}_ctx ctx;
    if (ub_{m}_init(&ctx, arena, sizeof arena, 1) != 0) return 1;
    for (int i = 0; i < UB_{M}_INPUT0_ELEMENTS; ++i) x[i] = (float)(i % 17) / 8.0f - 1.0f;
    for (int i = 0; i < UB_{M}_BATCH; ++i) labels[i] = i % {classes};
    float loss;
    for (int s = atoi(argv[1]); s > 0; --s) {{
        if (ub_{m}_train_step(&ctx, x, labels, &loss) != 0) return 2;
    }}
    return 0;
}}
"""
# an inclusive count of a function: "  1,234,567 (12.34%)  file:function [binary]"
LINE = re.compile(r"\s*([\d,]+) \([^)]*\)\s+\S*?:(ub_\w+?)"
                  r"(?:\.(?:constprop|isra|part)\.\d+)*(?: \[|$)")


def count(name: str, batch: int, steps: int, work: Path) -> dict:
    """{kernel: instructions a step} and the step's total, of zoo model `name`."""
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    pkg = ub.compile(entry.factory(), (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                     out_dir=work / "m")
    m = pkg.model_name
    (work / "main.c").write_text(MAIN_C.format(m=m, M=m.upper(), classes=entry.classes))
    library = cmake_build(pkg.out_dir, work / "build", shared=False) / f"libub_{m}.a"
    binary = work / "step"
    subprocess.run(["cc", "-O2", f"-I{pkg.out_dir}", f"-I{pkg.out_dir / 'runtime_c'}",
                    str(work / "main.c"), str(library), "-lm", "-o", str(binary)],
                   check=True, capture_output=True)
    out = work / "callgrind.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(binary),
                    str(steps)], check=True, capture_output=True)
    report = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                             str(out)], check=True, capture_output=True, text=True).stdout
    counts = Counter()
    for line in report.splitlines():
        found = LINE.match(line)
        if found and "=>" not in line:  # a function's own line, not one of its callers'
            fn = found.group(2)
            counts[fn] = max(counts[fn], int(found.group(1).replace(",", "")) / steps)
    step = counts.pop(f"ub_{m}_train_step")
    # the kernels train_step calls, not the cores and lanes they call in turn
    kernels = {k: v for k, v in counts.items() if k.startswith("ub_") and "_fma" not in k
               and "_lanes" not in k and "portable" not in k
               and not re.match(r"ub_f32_(i?gemm|gemm_nt)_ukernel", k)}
    return dict(model=name, batch=batch, step_instructions=step, kernels=kernels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenetv2_small", choices=list(ZOO))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("results/step_icount.json"))
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("step_icount.py needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        result = count(args.model, args.batch, args.steps, Path(tmp))
    total = result["step_instructions"]
    print(f"{args.model} b{args.batch}: {total / 1e6:.2f}M instructions a step")
    for kernel, n in Counter(result["kernels"]).most_common(args.top):
        print(f"{n / 1e3:9.0f}k {100 * n / total:5.1f}%  {kernel}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
