"""Arena of a sparse update against the full update, for every model of the zoo.

    python benchmarks/sparse_memory.py [--batch 8] [--out results/sparse_memory.json]

Rules: full update; every bias; every bias plus the last layer; the last two layers; every
bias plus a quarter of the output channels of the last two Conv2d/Linear layers (groups=1),
tiny-training's sparse scheme.
"""

import argparse
import tempfile
import warnings
from pathlib import Path

import torch
from _results import write_json

import ubitrain as ub
from ubitrain.zoo import ZOO

RULES = {
    "full": None,
    "biases": ub.SparseUpdate(biases=True),
    "biases+last1": ub.SparseUpdate(biases=True, last_layers=1),
    "last2": ub.SparseUpdate(last_layers=2),
    "biases+ch25%last2": "channels",  # per model: see channel_rule
}


def channel_rule(model: torch.nn.Module) -> ub.SparseUpdate:
    layers = [n for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear)
              or (isinstance(m, torch.nn.Conv2d) and m.groups == 1)]
    return ub.SparseUpdate(biases=True, channels={n: 0.25 for n in layers[-2:]})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("results/sparse_memory.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    print(f"{'model':<20}" + "".join(f"{r:>22}" for r in RULES))
    for name, entry in ZOO.items():
        torch.manual_seed(0)
        x = torch.randn(args.batch, *entry.sample_shape)
        y = torch.randint(0, entry.classes, (args.batch,))
        arena = {}
        for label, rule in RULES.items():
            model = entry.factory()
            rule = channel_rule(model) if rule == "channels" else rule
            with tempfile.TemporaryDirectory() as tmp:
                pkg = ub.compile(model, (x,), y, trainable=rule,
                                 optimizer=ub.SGD(lr=0.01, momentum=0.9), out_dir=Path(tmp) / "m")
            arena[label] = pkg.memory_plan.arena_bytes
        rows.append(dict(model=name, batch=args.batch, **arena))
        print(f"{name:<20}" + "".join(
            f"{arena[r]:>13,} ({arena['full'] / arena[r]:4.1f}x)" for r in RULES), flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
