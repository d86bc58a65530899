"""Micro-batching on the host: what k micro-batches cost next to one batch, measured and as
the budget's cost model predicts it.

    python benchmarks/micro_batch_speed.py [--models digits_cnn lenet5] [--batch 16]
                                           [--steps 30] [--out results/micro_batch_speed.json]

For each model and each divisor k of the batch, the step is compiled with
`micro_batches=k`, built for the host and run `--steps` times on one batch (after two
warm-up steps); the time of a step is the fastest and the median of those runs (the
machine is shared, so the fastest is the least disturbed). Beside it: the arena, and the
step's cost in the host profile of memory/cost_model.py (iterations and per-call costs,
the loop's calls k times). Every figure is also given over k = 1's, so the ratio the budget
search relies on (cost(k) / cost(1)) can be read against the measured one.
"""

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from _results import write_json

import ubitrain as ub
from ubitrain.api import lower
from ubitrain.memory.cost_model import KernelWork
from ubitrain.targets import get_target
from ubitrain.training.batch_coupling import divisors
from ubitrain.zoo import ZOO


def model_seconds(model, x, y, optimizer, k):
    """One step's cost in the host cost model."""
    unit = lower(model, (x,), y, optimizer=optimizer, micro_batches=k,
                 disable_passes=("microkernels",))
    return KernelWork(unit.library).step_seconds(unit.train, get_target("host").cost)


def measure(name, batch, steps, root):
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    optimizer = ub.SGD(lr=0.01, momentum=0.9)
    rows = []
    for k in divisors(batch):
        torch.manual_seed(1)
        model = entry.factory()
        pkg = ub.compile(model, (x,), y, optimizer=optimizer, micro_batches=k,
                         out_dir=root / f"{name}_{batch}_k{k}")
        trainer = pkg.build()
        xs, ys = x.numpy(), y.numpy()
        for _ in range(2):
            trainer.step(xs, ys)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.step(xs, ys)
            times.append(time.perf_counter() - start)
        rows.append(dict(model=name, batch=batch, k=k, arena=pkg.memory_plan.arena_bytes,
                         fastest_ms=1e3 * min(times),
                         median_ms=1e3 * statistics.median(times),
                         model_ms=1e3 * model_seconds(model, x, y, optimizer, k)))
    base = rows[0]
    for r in rows:
        r.update(arena_ratio=r["arena"] / base["arena"],
                 fastest_ratio=r["fastest_ms"] / base["fastest_ms"],
                 median_ratio=r["median_ms"] / base["median_ms"],
                 model_ratio=r["model_ms"] / base["model_ms"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["digits_cnn", "lenet5"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("results/micro_batch_speed.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # BatchNorm per micro-batch: expected here
    rows = []
    print(f"{'model':<12}{'b':>3}{'k':>4}{'arena':>11}{'/k=1':>7}{'fastest ms':>11}{'/k=1':>7}"
          f"{'median ms':>10}{'/k=1':>7}{'model ms':>10}{'/k=1':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for r in measure(name, args.batch, args.steps, Path(tmp)):
                rows.append(r)
                print(f"{name:<12}{r['batch']:>3}{r['k']:>4}{r['arena']:>11,}"
                      f"{r['arena_ratio']:>7.3f}{r['fastest_ms']:>11.3f}"
                      f"{r['fastest_ratio']:>7.3f}{r['median_ms']:>10.3f}"
                      f"{r['median_ratio']:>7.3f}{r['model_ms']:>10.3f}"
                      f"{r['model_ratio']:>7.3f}", flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
