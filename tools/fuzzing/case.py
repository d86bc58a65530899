"""One case of the differential fuzzer: a random model trained through the generated C and in
PyTorch.

One case is one seed: a random graph (graphs.py), its weights, a loss, an optimizer, 1 to 3
steps of random data, and a random set of rewrite passes to switch off (the rewrites of
pipeline/fp32.py). The case compiles the model twice, with every pass on (A) and with that
set off (B), and trains both on the host:

  * each against PyTorch, step by step (ubitrain.fidelity.judge): a mismatch is a wrong step;
  * A against B: where only bit-exact passes are off, the two must agree bit for bit
    (every loss, parameter, buffer and optimizer state, and predict's output); a rewrite
    that changes one bit is wrong even where the referee's tolerance would hide it.

Data near a kink (ubitrain/fidelity/kinks.py) would make the referee's verdict meaningless,
so a case first draws batches until PyTorch's own run keeps clear of kinks (at most
DATA_DRAWS times).
The arena starts as NaN (0xFF bytes), so a kernel that reads memory nothing wrote poisons
the step instead of reading a harmless zero.
"""

from __future__ import annotations

import random
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ubitrain.errors import RuntimeStatusError, UnsupportedOpError
from ubitrain.fidelity.referee import Verdict, judge, kinks_along
from ubitrain.fidelity.reference import Reference
from ubitrain.optim import SGD, Adam, AdamW
from ubitrain.pipeline import FP32

from .graphs import Graph, instantiate, random_graph

DATA_DRAWS = 6


@dataclass
class Case:
    seed: int
    graph: Graph
    optimizer: object
    steps: int
    disabled: tuple[str, ...]  # the passes variant B switches off
    trainable: tuple[str, ...] | None = None  # None: every parameter

    def batches(self, draw: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = self.graph
        return seeded_batches(self.seed, draw, g.input_shape, self.steps, g.loss, g.outputs)


def seeded_batches(seed: int, draw: int, shape, steps: int, loss: str,
                   outputs: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A case's training data: `steps` batches of inputs at one random scale, with class
    labels for cross-entropy or targets for MSE; the same for the same seed and draw."""
    gen = torch.Generator().manual_seed(seed * 1000 + draw)
    scale = float(torch.empty(()).uniform_(0.5, 2.0, generator=gen))
    out = []
    for _ in range(steps):
        x = torch.randn(shape, generator=gen) * scale
        if loss == "cross_entropy":
            y = torch.randint(0, outputs, (shape[0],), generator=gen)
        else:
            y = torch.randn((shape[0], outputs), generator=gen)
        out.append((x, y))
    return out


def draw_case(seed: int) -> Case:
    rng = random.Random(seed)
    graph = random_graph(rng)
    optimizer = rng.choice([
        lambda: SGD(lr=rng.choice([0.01, 0.05, 0.1]), momentum=0.9,
                    weight_decay=rng.choice([0.0, 1e-3]), nesterov=rng.random() < 0.3),
        lambda: SGD(lr=rng.choice([0.05, 0.1]), momentum=0.9, dampening=0.1),
        lambda: Adam(lr=rng.choice([1e-3, 1e-2]), weight_decay=rng.choice([0.0, 1e-3])),
        lambda: AdamW(lr=1e-2, weight_decay=1e-2),
    ])()
    passes = [r.name for r in FP32.rewrites]  # in pipeline order
    disabled = tuple(p for p in passes if rng.random() < 0.4) or (rng.choice(passes),)
    return Case(seed, graph, optimizer, rng.randint(1, 3), disabled)


@dataclass
class Outcome:
    seed: int
    status: str  # match, mismatch, near kink, diverges, unsupported, internal error
    detail: str = ""
    seconds: float = 0.0
    draw: int = 0  # the data draw the case ran on (Case.batches)
    verdicts: dict[str, Verdict] = field(default_factory=dict, repr=False)

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "internal error")


def run_case(case: Case, workdir: Path | None = None) -> Outcome:
    return run_guarded(case.seed, lambda tmp: _run(case, tmp), workdir, f"fuzz{case.seed}_")


def run_guarded(seed: int, run, workdir: Path | None, prefix: str) -> Outcome:
    """`run(tmp)` in a temporary folder, its failures as outcomes, timed (every kind of
    case: this one, int8_case.py's)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=workdir, prefix=prefix) as tmp:
        try:
            outcome = run(Path(tmp))
        except UnsupportedOpError as err:
            outcome = Outcome(seed, "unsupported", str(err))
        except Exception as err:  # noqa: BLE001 - any other failure of ubitrain is a finding
            # a C status (a non-finite loss) is a wrong step; anything else, a compiler bug
            kind = "mismatch" if isinstance(err, RuntimeStatusError) else "internal error"
            outcome = Outcome(seed, kind, "".join(
                traceback.format_exception_only(type(err), err)).strip()
                + "\n" + traceback.format_exc(limit=-6))
    outcome.seconds = time.perf_counter() - start
    return outcome


def clear_batches(case: Case, model) -> tuple[list, int]:
    """The case's data: the first draw on which PyTorch's own run keeps clear of kinks (the
    last of DATA_DRAWS if none does), and its number."""
    probe = Reference(model, case.optimizer, case.graph.loss,
                      [n for n, _ in model.named_parameters()])
    for draw in range(DATA_DRAWS):
        batches = case.batches(draw)
        if not kinks_along(probe, batches, case.seed):
            break
    return batches, draw


def _run(case: Case, tmp: Path) -> Outcome:
    model = instantiate(case.graph, case.seed)
    trainable = list(case.trainable) if case.trainable is not None else None
    batches, draw = clear_batches(case, model)
    verdicts = {variant: judge(model, batches, case.optimizer, tmp / variant,
                               case.graph.loss, case.seed, trainable=trainable,
                               disable_passes=disabled)
                for variant, disabled in (("A", ()), ("B", case.disabled))}
    bad = [f"{v} ({'passes on' if v == 'A' else 'off: ' + ', '.join(case.disabled)}): "
           f"{verdicts[v].summary()}" for v in verdicts if verdicts[v].status == "mismatch"]
    if set(case.disabled) <= set(FP32.bit_exact):
        differ = first_difference(verdicts["A"], verdicts["B"])
        if differ:
            bad.append(f"passes off ({', '.join(case.disabled)}) change the step: {differ}")
    if bad:
        return Outcome(case.seed, "mismatch", "\n".join(bad), draw=draw, verdicts=verdicts)
    for status in ("diverges", "near kink"):  # not judged: PyTorch's loss is not finite,
        if any(v.status == status for v in verdicts.values()):  # or data sat at a kink
            return Outcome(case.seed, status, "\n".join(
                f"{k}: {v.summary()}" for k, v in verdicts.items()), draw=draw,
                verdicts=verdicts)
    return Outcome(case.seed, "match", draw=draw, verdicts=verdicts)


def first_difference(a: Verdict, b: Verdict) -> str | None:
    """Where two runs (their steps, then predict's output) first differ in a bit."""
    for step, (x, y) in enumerate(zip(a.trajectory, b.trajectory), 1):
        if np.float32(x[0]).tobytes() != np.float32(y[0]).tobytes():
            return f"the loss of step {step}"
        for part in (1, 2):
            for name in x[part]:
                if x[part][name].tobytes() != y[part][name].tobytes():
                    return f"{name} after step {step}"
    if a.prediction is None or b.prediction is None:  # PyTorch's own is not finite
        return None
    return None if np.array_equal(a.prediction, b.prediction) else "predict's output"
