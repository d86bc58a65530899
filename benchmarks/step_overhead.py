"""What trainer.step's checks cost: step(x, y) against bound_step (the same C step with the
batch checked once), in interleaved rounds so that the machine's load falls on both.

    python benchmarks/step_overhead.py [--batch 8] [--rounds 2000]
                                       [--out results/step_overhead.json]

The digits CNN (conv-BN-ReLU-pool, conv-ReLU, linear) on one thread. Three callers: numpy
arrays already in the compiled layout (float32 images, int32 labels), the same with int64
labels (what torch.randint gives; cast and range-checked in Python), and torch tensors.
Medians of per-round times; ratios to bound_step.
"""

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from ubitrain.zoo import ZOO


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--out", default="results/step_overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    entry = ZOO["digits_cnn"]
    x = np.random.default_rng(0).normal(size=(args.batch, *entry.sample_shape)).astype("f4")
    y = np.arange(args.batch) % entry.classes
    with tempfile.TemporaryDirectory() as tmp:
        trainer = ub.compile(entry.factory(), (torch.from_numpy(x),), torch.from_numpy(y),
                             out_dir=tmp, progress=False).build()
        y32, tx, ty = y.astype(np.int32), torch.from_numpy(x), torch.from_numpy(y)
        callers = {"bound_step": trainer.bound_step(x, y),
                   "step, int32 labels": lambda: trainer.step(x, y32),
                   "step, int64 labels": lambda: trainer.step(x, y),
                   "step, torch tensors": lambda: trainer.step(tx, ty)}
        times = {name: [] for name in callers}
        for _ in range(args.rounds):
            for name, call in callers.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["bound_step"])
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        rows.append(dict(caller=name, ms=median * 1e3, ratio=median / base))
        print(f"{name:22s} {median * 1e3:.4f} ms  {median / base:.2f}x bound_step")
    write_json(args.out, dict(batch=args.batch, rounds=args.rounds, rows=rows))


if __name__ == "__main__":
    main()
