"""An int8 (NITI) trainer against the numpy reference, step by step: the check the tests and
the fuzzer's int8 cases make of the generated C.

The reference (niti_reference.py, read off the model's ATen graph, each BatchNorm folded
first as the compile folds it) gives each step's loss and integer gradients; NITI's update
rule (niti/update.py) applied to them gives the parameters the C must hold after the step,
bit for bit; predict's output after the last step must be the reference's too. A compile
with micro-batches is checked against the same reference over as many micro-batches
(niti_micro_batches.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from ..niti import channel_exponents
from ..niti.rescale import ADAPTIVE, EXACT_COUNTED, SKIPS
from ..niti.update import niti_update
from ..training.batch_norm_folding import batch_norms, fold_batch_norms
from .niti_micro_batches import MicroBatchedReference
from .niti_reference import NitiGraphReference
from .niti_sparse import trained_rows, update_rows

LOSS_TOLERANCE = 1e-6  # the loss is float maths on both sides (log-sum-exp), not integers


@dataclass
class NitiComparison:
    differences: list[str] = field(default_factory=list)  # empty: bit-exact
    moved: int = 0  # parameter elements that changed over the run
    skipped: int = 0  # shift reductions the reference's adaptive sites skipped


def compare_with_reference(trainer, model, batches, config, first_step: int = 0,
                           trainable=None) -> NitiComparison:
    """Train `trainer` (an int8 compile of `model` with its rescale sites fresh, `first_step`
    steps done) on `batches` of (x, labels) beside the reference with `config` (ub.NITI),
    from the trainer's parameters; stop at the first step that differs. `trainable`: the
    compile's, read for the rows a SparseUpdate trains by channels (niti_sparse.py)."""
    integer_norms = trainer.package.config.batch_norm == "integer"  # as the compile chose
    if not integer_norms:
        model = fold_batch_norms(model)  # what the compile trains
    mode = ADAPTIVE if config.adaptive_rescale else EXACT_COUNTED
    example = torch.as_tensor(np.asarray(batches[0][0]))
    k = trainer.package.memory_plan.micro_batches
    reference = NitiGraphReference(model, example, mode, config.max_interval) if k == 1 \
        else MicroBatchedReference(model, example, k, mode, config.max_interval)
    norms = batch_norms(model) if integer_norms else []
    statistics = [f"{owner}.{s}" for owner in norms for s in ("running_mean", "running_var")]
    if norms:  # the integer BatchNorms' running statistics, from the trainer's
        held = trainer.int8_state()
        reference.running = {owner: [held[f"{owner}.running_mean"].astype(np.int64),
                                     held[f"{owner}.running_var"].astype(np.int64),
                                     int(held[f"{owner}.running_mean.exponent"][0]),
                                     int(held[f"{owner}.running_var.exponent"][0])]
                             for owner in norms}
    state = trainer.int8_parameters()
    names = [n for n, _ in model.named_parameters()]
    trained = set(trainer.package.trainable)  # a frozen parameter keeps its values
    rows = trained_rows(model, trainable)  # a weight trained by channels: its first rows
    out = NitiComparison()
    parts = sorted(n for n in trained if "[" in n)
    if parts != sorted(f"{n}[0:{count}]" for n, count in rows.items()):
        out.differences.append(f"the compile trains the parts {parts}; the reference the first "
                               f"rows {rows}")
        return out
    params = {n: (state[n], _exponent(state[f"{n}.exponent"])) for n in names}
    for step, (x, y) in enumerate(batches):
        x, y = np.asarray(x), np.asarray(y)
        loss = trainer.step(x, y)
        want_loss, grads = reference.step(x, y, params)
        mu = config.mu_at(first_step + step)
        for n, (v, e) in params.items():
            if n in trained:
                params[n] = (_updated(v, grads[n], e, mu), e)
            elif n in rows:
                update = functools.partial(_updated, exponent=e, mu=mu)
                params[n] = (update_rows(update, v, grads[n], rows[n]), e)
        got = trainer.int8_parameters()
        out.differences += [f"step {step}: {n} differs in {int((got[n] != params[n][0]).sum())}"
                            f" of {got[n].size} elements" for n in names
                            if not np.array_equal(got[n], params[n][0])]
        if statistics:
            held = trainer.int8_state()
            want = {f"{o}.{s}": v for o, r in reference.running.items()
                    for s, v in zip(("running_mean", "running_var"), r)}
            out.differences += [f"step {step}: {n} differs" for n in statistics
                                if not np.array_equal(held[n], want[n])]
        if abs(loss - want_loss) > LOSS_TOLERANCE * abs(want_loss):
            out.differences.append(f"step {step}: loss {loss} against {want_loss}")
        if out.differences:
            return out
    out.moved = sum(int((got[n] != state[n]).sum()) for n in names)
    x = np.asarray(batches[-1][0])
    if not np.array_equal(trainer.predict(x), reference.predict(x, params)):
        out.differences.append("predict's output differs")
    out.skipped = sum(int(row[SKIPS]) for row in reference.sites.rows.values())
    return out


def _exponent(held: np.ndarray):
    """A parameter's exponent: an int, or an int32 array of one per output channel."""
    return held.astype(np.int32) if held.size > 1 else int(held[0])


def _updated(value, grad, exponent, mu: int):
    if np.ndim(exponent):
        return channel_exponents.update(value, grad, exponent, mu)
    return niti_update(value, grad, mu).astype(value.dtype)
