"""Real models through ubitrain: what each costs to compile and build, its memory next to
PyTorch's, and its training step next to PyTorch's on one thread.

    python benchmarks/real_models.py [--models resnet18 ...] [--batch 8] [--repeat 10]
                                     [--out results/real_models.json]

The models of the fidelity suite (tools/real_models.py: torchvision's classifiers
at 3x64x64 and a tiny ViT at 3x32x32, LeNet-5, a DS-CNN, a 1-D HAR CNN, a fastText-style text
classifier on token ids), SGD momentum 0.9. Per model: parameters; `ub.compile` seconds; the C
build's seconds (CMake, host); the arena (everything the step needs: parameters, optimizer
state, activations) against PyTorch's measured peak of one step (benchmarks/memory.py); the
median step of the generated C (`bound_step`) against PyTorch eager, both on one thread and
timed in interleaved rounds (benchmarks/speed.py).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy, torch or tvm is imported

import argparse  # noqa: E402
import copy  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from _results import write_json  # noqa: E402
from memory import pytorch_training_memory  # noqa: E402
from speed import interleaved_medians, torch_step  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import ubitrain as ub  # noqa: E402
from tools.real_models import REAL_MODELS, batches, real_model  # noqa: E402

LR, MOMENTUM = 0.01, 0.9


def measure(name: str, batch: int, repeat: int, root: Path) -> dict:
    spec = real_model(name)
    torch.manual_seed(0)
    model = spec.make()
    ((x, y),) = batches(spec, batch, steps=1)  # float samples, or token ids (spec.make_input)
    start = time.perf_counter()
    pkg = ub.compile(copy.deepcopy(model), (x,), y, optimizer=ub.SGD(lr=LR, momentum=MOMENTUM),
                     out_dir=root / name, progress=False)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    trainer = pkg.build(progress=False)
    build_s = time.perf_counter() - start
    c_step = trainer.bound_step(x.numpy(), y.numpy())
    peak = pytorch_training_memory(copy.deepcopy(model), x, y)["pytorch_peak"]
    with threadpool_limits(limits=1):
        times = interleaved_medians({"c": c_step, "torch": torch_step(model, x, y)},
                                    repeat=repeat, warmup=2)
    return dict(model=name, batch=batch, params=sum(p.numel() for p in model.parameters()),
                compile_s=compile_s, build_s=build_s, arena_bytes=pkg.memory_plan.arena_bytes,
                pytorch_peak_bytes=peak, c_step_s=times["c"], torch_step_s=times["torch"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[m.name for m in REAL_MODELS])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", default="results/real_models.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':16} {'params':>11} {'compile s':>9} {'build s':>8} {'arena MB':>9} "
          f"{'PT peak MB':>10} {'arena/PT':>8} {'C ms':>8} {'PT ms':>8} {'PT/C':>6}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            r = measure(name, args.batch, args.repeat, Path(tmp))
            rows.append(r)
            print(f"{name:16} {r['params']:>11,} {r['compile_s']:>9.1f} {r['build_s']:>8.1f} "
                  f"{r['arena_bytes'] / 1e6:>9.2f} {r['pytorch_peak_bytes'] / 1e6:>10.2f} "
                  f"{r['arena_bytes'] / r['pytorch_peak_bytes']:>8.2f} "
                  f"{1e3 * r['c_step_s']:>8.2f} {1e3 * r['torch_step_s']:>8.2f} "
                  f"{r['torch_step_s'] / r['c_step_s']:>6.2f}", flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
