"""What both engines do before the first round: check the data and the model against each
other, compile the model (for the server, and for the clients' target), write each client's
shard to its own file, and take the initial global model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ubitrain as ub

from ..errors import UbitrainError
from ..targets import get_target
from ..training.sparse_update import SparseUpdate
from .data import checked_data, classes_in, save_shards
from .int8_exchange import exchanged_int8_names, initial_int8_model
from .local import LocalTraining, exchanged_names
from .packages import check_classes, fleet_package, fresh_model

PRECISIONS = ("fp32", "int8")
NITI_MU = (5, 4, 3)


def fleet_niti(total_steps: int) -> ub.NITI:
    """int8 clients' default schedule: mu 5, 4, 3 over the thirds of the fleet's steps (the
    global step count, `niti.step`, int8_exchange.py)."""
    milestones = tuple(sorted({max(1, total_steps * (i + 1) // len(NITI_MU))
                               for i in range(len(NITI_MU) - 1)}))
    return ub.NITI(mu=NITI_MU[:len(milestones) + 1], milestones=milestones)


def fleet_optimizer(optimizer, precision: str, total_steps: int):
    """The clients' optimizer: ub.SGD (default lr 0.05, momentum 0.9), restarted each round,
    or for int8 clients ub.NITI (default: fleet_niti)."""
    if precision not in PRECISIONS:
        raise UbitrainError(f"precision={precision!r}: choose fp32 or int8")
    if precision == "int8":
        optimizer = optimizer if optimizer is not None else fleet_niti(total_steps)
        if not isinstance(optimizer, ub.NITI):
            raise UbitrainError(f"precision='int8' clients train with NITI's integer rule, not "
                                f"{type(optimizer).__name__}: pass optimizer=ub.NITI(...) or "
                                "None (mu 5, 4, 3 over the thirds of the fleet's steps)")
        return optimizer
    optimizer = optimizer if optimizer is not None else ub.SGD(lr=0.05, momentum=0.9)
    if not isinstance(optimizer, ub.SGD):
        raise UbitrainError(f"optimizer={type(optimizer).__name__}(...): a fleet's client "
                            "restarts its optimizer every round, which is exact for SGD's "
                            "momentum only; pass ub.SGD(lr=..., momentum=...)")
    return optimizer


@dataclass
class Prepared:
    shards: list  # (x, y) of each client
    test: tuple | None  # the server's (x, y)
    data_dir: Path  # each shard in its own file
    evaluator: object  # the server's host trainer
    client_project: Path  # the project the clients load (the target's build)
    client_library: Path | None  # its host library; None: under the target's emulator
    initial: dict  # the global model of round 0
    local: LocalTraining
    optimizer: object
    model_name: str  # the model's class, for the plot


def prepare(model_factory, client_data, test_data, *, out_dir: Path, target: str,
            precision: str, optimizer, batch: int, local_steps: int, sparse: bool, seed: int,
            progress, total_steps: int) -> Prepared:
    shards, test = checked_data(client_data, test_data)
    if batch < 1:
        raise UbitrainError(f"batch={batch}: give a batch of at least one sample")
    if not callable(model_factory):
        raise UbitrainError(f"model_factory must be a function returning a torch.nn.Module "
                            f"(called once a compile), got {type(model_factory).__name__}")
    optimizer = fleet_optimizer(optimizer, precision, total_steps)
    sample_shape = shards[0][0].shape[1:]
    model = fresh_model(model_factory, seed)
    check_classes(model, sample_shape, batch, classes_in(shards, test))
    compiled = dict(model_factory=model_factory, sample_shape=sample_shape, batch=batch,
                    optimizer=optimizer, seed=seed, progress=progress, precision=precision,
                    trainable=SparseUpdate(biases=True, last_layers=1) if sparse else None)
    _, evaluator = fleet_package(out_dir, "host", **compiled)  # the server's
    client_project, client_library = Path(evaluator.package.out_dir), evaluator.library
    if not get_target(target).runs_on_host:  # the clients run its build under its emulator
        client_project, device = fleet_package(out_dir, target, **compiled)
        device.close()
        client_library = None
    if precision == "int8":
        initial = initial_int8_model(evaluator, exchanged_int8_names(evaluator, sparse))
    else:
        names = exchanged_names(evaluator, sparse)
        initial = {k: v for k, v in evaluator.parameters().items() if k in names}
    data_dir = out_dir / "data"
    save_shards(data_dir, shards, test)
    lr = float(getattr(optimizer, "lr", 0.0))
    return Prepared(shards, test, data_dir, evaluator, client_project.resolve(),
                    client_library, initial, LocalTraining(local_steps, batch, lr), optimizer,
                    type(model).__name__)


def concatenated(shards) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([s[0] for s in shards]), np.concatenate([s[1] for s in shards])
