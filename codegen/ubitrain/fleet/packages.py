"""The fleet's compiled model: one package per target, all from the same initial weights, so
that host and device clients exchange the same tensors."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

import ubitrain as ub

from ..zoo import DigitsCNN


def fleet_package(out_dir: Path, target: str = "host", model=None, batch: int = 16,
                  sample_shape=(1, 8, 8), lr: float = 0.05, momentum: float = 0.9,
                  sparse: bool = False, seed: int = 0, progress: bool | None = False):
    """`model()` (default: the demo's digits CNN, 10 classes) compiled for `target` with the
    seed's initial weights and built (a cross target's driver too): (the package pickled in
    `out_dir/target/package.pkl`, its trainer). The caller closes an emulated trainer."""
    torch.manual_seed(seed)
    pkg = ub.compile((model or DigitsCNN)(), (torch.zeros((batch, *sample_shape)),),
                     torch.zeros(batch, dtype=torch.long),
                     optimizer=ub.SGD(lr=lr, momentum=momentum),
                     trainable=ub.SparseUpdate(biases=True, last_layers=1) if sparse else None,
                     target=target, out_dir=Path(out_dir) / target, progress=progress)
    trainer = pkg.build(seed=seed, progress=progress)
    package_file = Path(out_dir) / target / "package.pkl"
    package_file.write_bytes(pickle.dumps(pkg))
    return package_file, trainer
