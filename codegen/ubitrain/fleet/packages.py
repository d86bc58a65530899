"""The fleet's compiled model: one project per target, all from the same initial weights, so
that host and device clients exchange the same tensors. A client gets its model as the
project's directory (C sources, weights.bin, package.json) and loads it with
`ub.load_package` (project/manifest.py): no pickle crosses from the server to a client."""

from __future__ import annotations

import copy
from pathlib import Path

import ubitrain as ub

from ..errors import UbitrainError

# torch is imported by the functions that make the model: a client's process only opens a
# trainer (open_trainer), and torch takes seconds to import.


def fresh_model(model_factory, seed: int):
    """`model_factory()` under `seed`: the same initial weights in every process."""
    import torch

    torch.manual_seed(seed)
    model = model_factory()
    if not isinstance(model, torch.nn.Module):
        raise UbitrainError(f"model_factory() returned a {type(model).__name__}; it must "
                            "return a torch.nn.Module (a new one at each call)")
    return model


def check_classes(model, sample_shape, batch: int, classes: int) -> None:
    """The model's output has a logit for every class of the data: refused up front (one
    forward pass of a copy in PyTorch) rather than after the compile."""
    import torch

    probe = copy.deepcopy(model).eval()
    with torch.no_grad():
        try:
            out = probe(torch.zeros((batch, *sample_shape)))
        except Exception as err:  # noqa: BLE001 - the user's model, told in one line
            raise UbitrainError(f"model_factory()'s module does not take the fleet's samples "
                                f"(a batch of shape {[batch, *sample_shape]}): "
                                f"{type(err).__name__}: {err}") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != batch:
        raise UbitrainError(f"model_factory()'s module returns "
                            f"{list(getattr(out, 'shape', [])) or type(out).__name__} for a "
                            f"batch of {batch}; a fleet trains classifiers: it must return "
                            f"logits [{batch}, classes]")
    if out.shape[1] < classes:
        raise UbitrainError(f"model_factory()'s module gives {out.shape[1]} class logits, but "
                            f"the data has labels up to {classes - 1}: give a model with "
                            f"{classes} outputs (or data with fewer classes)")


def fleet_package(out_dir: Path, target: str, model_factory, sample_shape, batch: int,
                  optimizer, trainable=None, seed: int = 0, progress: bool | None = False,
                  precision: str = "fp32"):
    """`model_factory()` compiled for `target` with the seed's initial weights into
    `out_dir/target` (the project a client receives) and built (a cross target's driver
    too): (the project's directory, its trainer). The caller closes an emulated trainer."""
    import torch

    project = Path(out_dir) / target
    example = torch.zeros((batch, *sample_shape))
    pkg = ub.compile(fresh_model(model_factory, seed), (example,),
                     torch.zeros(batch, dtype=torch.long), optimizer=optimizer,
                     trainable=trainable, target=target, out_dir=project, progress=progress,
                     precision=precision)
    return project, pkg.build(seed=seed, progress=progress)


def open_trainer(package, library: Path | None, seed: int):
    """A trainer of `package`: its host `library` loaded, or (None) the package built for
    its target (on the host, with CMake; a cross target's driver under its emulator); an
    int8 package's behind its Int8Trainer."""
    if library:
        from ..runtime.host_trainer import HostTrainer
        trainer = HostTrainer(library, package, seed=seed)
        if getattr(package, "precision", "fp32") == "int8":
            from ..runtime.int8_trainer import Int8Trainer
            trainer = Int8Trainer(trainer, package)
        return trainer
    return package.build(seed=seed, progress=False)

