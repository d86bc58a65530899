"""What the mutants of one model share: PyTorch's runs of the first step.

The referee starts every step from the state the C reached before it (teacher forcing), so
only step 1 starts from the same state for every mutant: the model's initial one, with no
optimizer state. Its float64 run, its float32 runs (the three, and the 16 more a failing
check asks for), each pinned to float64's branches, and float64's runs with near-kink
elements flipped depend on the model and data alone. `SharedReference` runs each of them
once per model and batch, and hands every later mutant the same result (and the same
recorder outcome), where each mutant ran all of them again: on a torchvision model each is
a PyTorch step of the whole model, under a dispatch mode, and most of a mutant's time.

A run is looked up by the content of everything it depends on (state, batch, variant,
dtype, the branches it is pinned to or flips), so a hit is the run it replaces, bit for bit.
A run that replays the C's own side (`SideReplay` with the C's tensors) depends on the
mutant and is never shared; nor are later steps (their state is the mutant's C's).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from ubitrain.fidelity.kinks import Decisions
from ubitrain.fidelity.reference import EXACT, Reference, StepResult
from ubitrain.fidelity.sides import SideReplay

# what a SideReplay learns in a run, which the referee reads after it
_OUTCOME = ("decisions", "unflipped", "replayed", "pinned", "unreplayed", "unpinned", "differs")


def _digest(value, h) -> None:
    """Feed `value` (arrays, tensors, containers, scalars) to the hash `h`."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value):
            h.update(repr(k).encode())
            _digest(value[k], h)
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _digest(v, h)
    elif isinstance(value, Decisions):
        _digest((value.ops, value.taken), h)
    else:
        h.update(repr(value).encode())


def _recorder_key(recorder):
    """What a recorder makes the run depend on; None for a run that cannot be shared."""
    if recorder is None:
        return "none"
    if type(recorder) is not SideReplay or recorder.c_tensors is not None:
        return None  # the C's side: the mutant's own
    return (recorder.pin, recorder.near, recorder.flip)


@dataclass
class SharedReference(Reference):
    runs: dict = field(init=False, default_factory=dict)  # key -> (result, recorder outcome)
    hits: int = field(init=False, default=0)

    def step(self, state, opt_state, step: int, batch, rng_state: int, dtype=torch.float64,
             variant=EXACT, record: bool = False, recorder=None) -> StepResult:
        config = _recorder_key(recorder)
        if step != 1 or config is None:
            return super().step(state, opt_state, step, batch, rng_state, dtype, variant,
                                record, recorder)
        h = hashlib.blake2b(digest_size=20)
        _digest((state, opt_state, batch, rng_state, str(dtype), repr(variant), record,
                 config), h)
        key = h.digest()
        if key in self.runs:
            self.hits += 1
        else:
            result = super().step(state, opt_state, step, batch, rng_state, dtype, variant,
                                  record, recorder)
            outcome = {a: getattr(recorder, a) for a in _OUTCOME} if recorder else {}
            self.runs[key] = (result, outcome)
        result, outcome = self.runs[key]
        for name, value in outcome.items():  # lists copied: the shared run's stay as they are
            setattr(recorder, name, list(value) if isinstance(value, list) else value)
        return result


class FirstStepOnly:
    """`reference` for a referee over the first step alone (run.first_step_mismatch), whose
    check of predict's output after that step is no check of the whole run's and is
    dropped: every float32 variant of that output is float64's, computed once, instead of
    up to 20 runs."""

    def __init__(self, reference: Reference):
        self.reference, self._output = reference, None

    def __getattr__(self, name):
        return getattr(self.reference, name)

    def evaluate(self, state, xs, dtype=torch.float64, variant=EXACT, record=False):
        if self._output is None or self._output[0] is not state:
            self._output = (state, self.reference.evaluate(state, xs, record=True))
        return self._output[1]
