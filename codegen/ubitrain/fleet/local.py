"""One client's round, whatever carries the messages: load the global tensors into the
trainer, take local SGD steps in generated C on the client's own shard, return the update."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.trainer_base import BUFFER, PARAMETER


@dataclass(frozen=True)
class LocalTraining:
    steps: int          # local steps a round
    batch: int          # the compiled batch size
    lr: float           # the compiled SGD learning rate (FedProx's proximal step uses it)


def exchanged_names(trainer, sparse: bool) -> list[str]:
    """The tensors that travel between server and clients: every float parameter and buffer
    (BatchNorm's running statistics are averaged too; integer counters stay local). With a
    sparse update the frozen parameters never change, so they never travel; the buffers
    still do, since training updates them."""
    trained = set(trainer.package.trainable)
    return [name for name, kind, dtype, _, _ in trainer.tensors
            if kind in (PARAMETER, BUFFER) and np.dtype(dtype).kind == "f"
            and (not sparse or name in trained or kind == BUFFER)]


def batch_indices(n: int, steps: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """`steps` batches of `batch` indices into a shard of `n` samples: epochs of shuffled
    passes back to back, so that every sample is seen equally often."""
    passes = -(-steps * batch // n)
    order = np.concatenate([rng.permutation(n) for _ in range(passes)])
    return order[:steps * batch].reshape(steps, batch)


def local_round(trainer, global_tensors: dict, x: np.ndarray, y: np.ndarray,
                spec: LocalTraining, seed: int, proximal_mu: float = 0.0):
    """(update, mean loss). The optimizer starts afresh each round. FedProx's proximal term
    mu/2 |w - w_global|^2 adds lr * mu * (w - w_global) to each plain-SGD step of a trained
    parameter: applied here after the C step, from the weights the step started from, which
    is the same update."""
    trainer.load_parameters(global_tensors)
    trainer.reset_optimizer_state()
    trained = set(trainer.package.trainable)
    losses = []
    for idx in batch_indices(len(x), spec.steps, spec.batch, np.random.default_rng(seed)):
        before = trainer.parameters() if proximal_mu else None
        losses.append(trainer.step(x[idx], y[idx]))
        if proximal_mu:
            now = trainer.parameters()
            trainer.load_parameters({
                k: (now[k] - np.float32(spec.lr * proximal_mu) * (before[k] - g)).astype(g.dtype)
                for k, g in global_tensors.items() if k in trained})
    everything = trainer.parameters()
    update = {k: everything[k] for k in global_tensors}
    return update, float(np.mean(losses))
