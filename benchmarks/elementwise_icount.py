"""Do the elementwise and reduction kernels of a training step need NEON micro-kernels, or
does the C compiler's auto-vectorisation already give them? Instruction counts, three builds
of the same printed kernel side by side in one program:

    python benchmarks/elementwise_icount.py [--targets aarch64-neon cortex-m4]
                                            [--models mobilenetv2_small digits_cnn]
                                            [--batch 2] [--out results/elementwise_icount.json]

(default models: both on aarch64-neon; digits_cnn on cortex-m4, whose 4 MiB of SRAM cannot
hold every kernel's inputs of mobilenetv2_small at once in the one harness program)

- `no-vectorize`: the kernel with auto-vectorisation off (`optimize("no-tree-vectorize")`),
  i.e. one element per instruction, what a hand-written NEON kernel would be compared with;
- `O2`: the same function with `optimize("O2")`: GCC 12's -O2 vectorises only the loops its
  "very cheap" cost model accepts (what the project built on AArch64 before -O3);
- `shipped`: the kernel as the generated project builds it, -O3 on AArch64 (the full
  vectoriser and its cost model; project/templates/CMakeLists.txt.j2).
On Cortex-M there is no float SIMD (the M4 and M7 FPUs are scalar), so the third build is
`unroll` (`optimize("unroll-loops")`) instead: what a hand-unrolled kernel could save.

The kernels are every printed (non micro-kernel) kernel of one training step of each model
with Adam (ReLU/ReLU6 and their gradients, adds, BatchNorm statistics and its gradient
sums, bias-gradient sums, the Adam update), each called once on random data. Counting is
benchmarks/icount.py's: qemu -singlestep -d nochain,exec, instructions between `ub_mark`s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import write_json  # noqa: E402
from icount import compiled_with, run_traced  # noqa: E402

import ubitrain as ub  # noqa: E402
from tools.microkernels import harness  # noqa: E402
from ubitrain.api import lower  # noqa: E402
from ubitrain.targets import get_target  # noqa: E402
from ubitrain.zoo import ZOO  # noqa: E402

DEFAULT_MODELS = {"aarch64-neon": ["mobilenetv2_small", "digits_cnn"]}
BUILDS = {"neon": {"no-vectorize": "no-tree-vectorize", "O2": "O2", "shipped": None},
          "cmsis_dsp": {"shipped": None, "unroll": "unroll-loops"}}


def step_kernels(model_name: str, batch: int, target: str):
    """The printed kernels of one training step (micro-kernels left out), with the element
    counts of their arguments."""
    entry = ZOO[model_name]
    torch.manual_seed(0)
    model = entry.factory()
    x = torch.randn((batch,) + entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    library = lower(model, (x,), y, optimizer=ub.Adam(lr=1e-3), target=target).library
    return [k for name, k in library.kernels.items() if "_ukernel_" not in name]


def inputs_for(kernel, rng) -> list[np.ndarray]:
    arrays = []
    for _, dtype, n in harness.split_params(kernel)[0]:
        if np.dtype(dtype).kind == "f":
            arrays.append(rng.standard_normal(n).astype(dtype))
        else:  # labels and indices: a valid class index everywhere
            arrays.append(np.zeros(n, dtype))
    return arrays


def count(target_name: str, models: list[str], batch: int, work: Path) -> list[dict]:
    target = get_target(target_name)
    builds = BUILDS[target.kernel_isa("float32")]
    rng = np.random.default_rng(0)
    cases, labels, seen = [], [], set()
    for model in models:
        for k in step_kernels(model, batch, target.name):
            op = k.name.removeprefix("ub_f32_").rsplit("__", 1)[0]
            key = (op.rstrip("0123456789"), tuple(p[2] for p in k.params))
            if key in seen or len(k.params) > 12:
                continue
            seen.add(key)
            variants = [compiled_with(k, b, o) for b, o in builds.items()]
            cases.append(harness.Case(op, variants, inputs_for(k, rng)))
            labels.append((model, op, k.params[-1][2]))
    binary = harness.build(cases, {}, target, work)
    marks = run_traced(target, str(binary), ["grep", "-n", "-E", " ub_mark$"])
    lines = [int(line.split(":")[0]) for line in marks.splitlines()]
    spans = [b - a - 1 for a, b in zip(lines[0::2], lines[1::2])]
    rows, at = [], 0
    for model, op, elements in labels:
        counts = dict(zip(builds, spans[at:at + len(builds)]))
        at += len(builds)
        rows.append(dict(model=model, kernel=op, output_elements=elements, **counts))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", nargs="+", default=["aarch64-neon", "cortex-m4"])
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", default="results/elementwise_icount.json")
    args = parser.parse_args(argv)
    results = {"batch": args.batch, "targets": {}}
    with tempfile.TemporaryDirectory(prefix="ub_elementwise_") as tmp:
        for name in args.targets:
            models = args.models or DEFAULT_MODELS.get(name, ["digits_cnn"])
            rows = count(name, models, args.batch, Path(tmp) / name)
            builds = list(BUILDS[get_target(name).kernel_isa("float32")])
            print(f"\n{name}: instructions per kernel call")
            print(f"{'kernel':<44} {'elements':>9} " + " ".join(f"{b:>13}" for b in builds))
            for r in rows:
                print(f"{r['kernel'][:44]:<44} {r['output_elements']:>9,} "
                      + " ".join(f"{r[b]:>13,}" for b in builds))
            totals = {b: sum(r[b] for r in rows) for b in builds}
            print(f"{'all ' + str(len(rows)) + ' kernels':<44} {'':>9} "
                  + " ".join(f"{totals[b]:>13,}" for b in builds))
            results["targets"][name] = {"models": models, "kernels": rows, "totals": totals}
    write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
