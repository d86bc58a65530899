"""Compile time and arena size against the lower bound, for every model of the zoo.

    python benchmarks/compile_memory.py [--batch 1 8] [--out results/compile_memory.json]

The lower bound is the most bytes alive at one moment of the step (no placement can use
less); the ratio arena / lower bound says how much the planner loses to fragmentation.
"""

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch
from _results import write_json

import ubitrain as ub
from ubitrain.zoo import ZOO


def measure(name: str, batch: int, out_root: Path) -> dict:
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    start = time.perf_counter()
    pkg = ub.compile(entry.factory(), (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                     out_dir=out_root / f"{name}_b{batch}")
    seconds = time.perf_counter() - start
    plan = pkg.memory_plan
    return dict(model=name, batch=batch, compile_seconds=round(seconds, 2),
                kernels=pkg.kernel_count, arena_bytes=plan.arena_bytes,
                lower_bound_bytes=plan.lower_bound_bytes,
                ratio=round(plan.arena_bytes / plan.lower_bound_bytes, 4),
                persistent_bytes=plan.persistent_bytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--out", type=Path, default=Path("results/compile_memory.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for batch in args.batch:
                rows.append(measure(name, batch, Path(tmp)))
                r = rows[-1]
                print(f"{r['model']:<20} batch {r['batch']:>3}  "
                      f"compile {r['compile_seconds']:6.2f} s"
                      f"  kernels {r['kernels']:>4}  arena {r['arena_bytes']:>10,} B  lower bound "
                      f"{r['lower_bound_bytes']:>10,} B  ratio {r['ratio']:.3f}", flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
