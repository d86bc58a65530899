"""The fleet's compiled model: one package per target, all from the same initial weights, so
that host and device clients exchange the same tensors."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

import ubitrain as ub

from ..zoo import DigitsCNN, DigitsCNNNiti


def fleet_package(out_dir: Path, target: str = "host", model=None, batch: int = 16,
                  sample_shape=(1, 8, 8), lr: float = 0.05, momentum: float = 0.9,
                  sparse: bool = False, seed: int = 0, progress: bool | None = False,
                  precision: str = "fp32", niti: ub.NITI | None = None):
    """`model()` compiled for `target` with the seed's initial weights and built (a cross
    target's driver too): (the package pickled in `out_dir/target/package.pkl`, its
    trainer). The caller closes an emulated trainer. fp32: SGD(lr, momentum), default model
    the demo's digits CNN; int8: NITI training with `niti`'s schedule, default model the
    same CNN without BatchNorm and biases (which NITI has no integer form for)."""
    torch.manual_seed(seed)
    default = DigitsCNNNiti if precision == "int8" else DigitsCNN
    optimizer = niti if precision == "int8" else ub.SGD(lr=lr, momentum=momentum)
    pkg = ub.compile((model or default)(), (torch.zeros((batch, *sample_shape)),),
                     torch.zeros(batch, dtype=torch.long), optimizer=optimizer,
                     trainable=ub.SparseUpdate(biases=True, last_layers=1) if sparse else None,
                     target=target, out_dir=Path(out_dir) / target, progress=progress,
                     precision=precision)
    trainer = pkg.build(seed=seed, progress=progress)
    package_file = Path(out_dir) / target / "package.pkl"
    package_file.write_bytes(pickle.dumps(pkg))
    return package_file, trainer
