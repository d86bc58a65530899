"""The verdict: does the generated C train this model as PyTorch does?

For every step, the referee starts PyTorch from the state the C reached before it (teacher
forcing: parameters, buffers, optimizer state, the Dropout generator), runs that step in
float64 (the referee) and in float32 three ways (as is; with inputs and state moved by one
rounding and two threads; the same in the channels-last layout without oneDNN: PyTorch's own
float32 implementations, reference.Variant), and compares what the step changed: the loss, and
for every parameter, buffer and optimizer state tensor the change `new - old`. Comparing
the change, not the new value, keeps small gradients visible under large weights, and the
optimizer state after the first step is the gradient itself (SGD's momentum buffer) or a
multiple of it (Adam's first moment), so gradients are checked directly. After the last
step, the eval-mode output of `predict` is compared too.

Tolerance, per tensor: the C's error against float64 must be at most `SPREAD_FACTOR` times
the largest error of the float32 runs (what rounding and the choice of a correct float32
algorithm do to this model here), plus
`FLOOR` float32 roundings of the tensor's scale (for values that float32 PyTorch happens to
compute exactly). A tensor whose float32 PyTorch already drifts is judged against float64
with that drift as the yardstick: a model cannot be waved through by a fixed constant.

Adam's second moment (`exp_avg_sq`, a running mean of g²) is compared as its square root,
a magnitude of g: every check is then linear in the rounding. Compared as it is, a gradient
that is pure rounding noise (one BatchNorm cancels exactly: its true value is 0) would have
its float32 spread squared, and a factor 3 of rounding noise on g would fail as a factor 9.

The float32 runs that set a tolerance take float64's branch at every kink (ReLU, ReLU6, leaky
ReLU, ELU, hardswish, clamp, ..., the max of a pooling window): `SideReplay(pin=...)`
(sides.py) forces float64's side in their backward wherever their own rounding put an
element on the other one, so the spread they measure is rounding alone; a run that took a
branch it cannot be forced to is left out of the spread (`Verdict.unpinned`). Unpinned, one
element of a float32 run across a ReLU6 kink could spread over a BatchNorm channel and widen
a tolerance a hundredfold (issue #39).

A failed check at a step where an element sat near a kink (kinks.py), or where a float32
run had to be pinned, is undecided: both sides of a kink are valid float32 results. `judge`
then decides it (sides.py): it builds the model again with a trace hook, replays the C's side
of every near-kink element in PyTorch's runs (the float32 ones pinned to that replayed float64
run), and judges again; only a step whose near-kink ops it cannot replay, or whose float32
runs it cannot pin, stays "near kink".
The fuzzer draws new data for such a model.

A near-kink excuse is bounded by what a kink can do. A branch taken otherwise moves the
backward alone (ReLU's value is continuous at 0, a pool's maximum at a tie), so the values
of the forward (the loss, the running statistics, predict's output) are never excused,
unless an op whose value itself jumps sat near its kink (kinks.VALUE_JUMPS). A failed
gradient, parameter or optimizer-state check is excused only within FLIP_FACTOR times its
`kink_effect`: how far float64 PyTorch's step moves when the near elements whose side is
unknown take the other one (all of them, and random halves); an op whose side cannot be
forced leaves it unbounded. So a C whose forward is wrong enough that its tensors cannot be
found for the replay (BatchNorm's eps off, on DS-CNN) is a mismatch, not "near kink".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..pipeline import CallTrace
from .kinks import FLOAT32_EPS, near_kinks, near_masks, value_jumps
from .reference import FLOAT32_VARIANTS, MORE_FLOAT32_VARIANTS, Reference
from .sides import ForwardCapture, SideReplay

SPREAD_FACTOR = 8.0
FLOOR = 4.0  # float32 roundings of the tensor's largest value
SQUARED_STATES = ("exp_avg_sq",)  # optimizer state that grows as g²: judged as sqrt
# A failure at a step with near-kink elements is excused only within FLIP_FACTOR times what
# flipping them does to float64 PyTorch: all of them, and FLIP_PATTERNS random halves (the C
# may flip any subset; a half catches what two opposite flips cancel in the whole)
FLIP_FACTOR = 2.0
FLIP_PATTERNS = 6


@dataclass
class Check:
    step: int  # 1-based; 0 for the eval output after the last step
    name: str
    error: float  # max |ub - float64|, relative to the float64 value's scale
    spread: float  # max |float32 PyTorch - float64|, the same way
    tolerance: float
    # a value of the forward alone (the loss, a buffer such as BatchNorm's running
    # statistics, predict's output): no backward branch reaches it
    forward: bool = False
    # at a step left undecided by near-kink elements: how far (like `error`) float64 PyTorch
    # moves when they take other sides (the largest over FLIP_PATTERNS; inf where an op's
    # side cannot be forced): what a kink may excuse (`_excused`)
    kink_effect: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    def __str__(self):
        return (f"step {self.step} {self.name}: error {self.error:.2e}, float32 PyTorch "
                f"{self.spread:.2e}, tolerance {self.tolerance:.2e}"
                + (f", kinks move it {self.kink_effect:.2e}" if self.kink_effect else ""))


@dataclass
class Verdict:
    # "match", "mismatch", "near kink" or "diverges" (PyTorch itself overflows: its float64
    # loss, or its own float32 step or prediction, is not finite)
    status: str
    checks: list[Check] = field(default_factory=list)
    near_kinks: dict[int, list[str]] = field(default_factory=dict)  # step -> ops
    replayed: dict[int, int] = field(default_factory=dict)  # step -> elements on the C's side
    unreplayed: dict[int, list[str]] = field(default_factory=dict)  # step -> ops (sides.py)
    # step -> ops where a float32 run took another branch than float64 and could not be
    # pinned to it (sides.py): that run was left out of the spread
    unpinned: dict[int, list[str]] = field(default_factory=dict)
    # what the C computed: per step (loss, state, optimizer state); predict's output after
    # the last step (None when PyTorch's own prediction is not finite: not asked of the C)
    trajectory: list = field(default_factory=list, repr=False)
    prediction: np.ndarray | None = field(default=None, repr=False)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        if self.status == "match":
            worst = max(self.checks, key=lambda c: c.error / max(c.tolerance, 1e-300),
                        default=None)
            return "match" + (f" (closest: {worst})" if worst else "") + self._replayed()
        lines = [self.status + self._replayed()] + [f"  {c}" for c in self.failures[:8]]
        if len(self.failures) > 8:
            lines.append(f"  ... {len(self.failures) - 8} more")
        for step, ops in self.near_kinks.items():
            lines.append(f"  near a kink at step {step}: {'; '.join(ops)}")
        for step, ops in self.unreplayed.items():
            lines.append(f"  not replayed at step {step}: {'; '.join(ops)}")
        for step, ops in self.unpinned.items():
            lines.append(f"  float32 runs not pinned to float64's branches at step {step}: "
                         f"{'; '.join(ops)}")
        return "\n".join(lines)

    def _replayed(self) -> str:
        n = sum(self.replayed.values())
        return f" ({n} near-kink elements took the C's side)" if n else ""


def compare(name, step, got, exact, rounded: list, base=None, forward=False) -> Check:
    """`got` (the C) and `rounded` (float32 runs) against `exact`, as changes from `base`."""
    exact = np.asarray(exact, np.float64)
    base = np.zeros_like(exact) if base is None else np.asarray(base, np.float64)
    want = exact - base
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-300)
    if not np.issubdtype(np.asarray(got).dtype, np.floating):  # counters: exactly
        error = float(np.any(np.asarray(got) != exact))
        return Check(step, name, error, 0.0, 0.0, forward)

    def err(x):
        d = np.abs((np.asarray(x, np.float64) - base) - want)
        return float(np.max(np.where(np.isnan(d), np.inf, d), initial=0.0)) / scale

    # a float32 run that is not finite where float64 is has failed, not measured rounding:
    # it must not make the tolerance infinite (a check that cannot fail)
    spread = max((e for e in map(err, rounded) if np.isfinite(e)), default=0.0)
    values = max(float(np.max(np.abs(exact), initial=0.0)), float(np.max(np.abs(base),
                                                                        initial=0.0)))
    floor = FLOOR * FLOAT32_EPS * max(values / scale, 1.0)
    return Check(step, name, err(got), spread, SPREAD_FACTOR * spread + floor, forward)


def _not_finite_where(f32, f64) -> bool:
    return bool(np.any(np.isfinite(f64) & ~np.isfinite(f32)))


def _overflows(f32, f64) -> bool:
    """PyTorch's own float32 step is not finite where its float64 step is (a loss of 1e240,
    or a gradient beyond 3.4e38): float32 cannot train the model this far."""
    return _not_finite_where(f32.loss, f64.loss) or any(
        _not_finite_where(f32.state[n], f64.state[n]) for n in f64.state) or any(
        _not_finite_where(f32.opt_state[n], f64.opt_state[n]) for n in f64.opt_state)


def _step_checks(k, loss, new_state, new_opt, exact, rounded, state, opt_state, trainable,
                 forward_runs) -> list:
    """Step `k` of the C (its loss, state and optimizer state) against float64 PyTorch's
    `exact` and the float32 runs `rounded`, all from `state` and `opt_state`. The values of
    the forward alone (the loss, the state that is not `trainable`: buffers) are measured
    against `forward_runs`: pinning a run's backward changes nothing they depend on."""
    checks = [compare("loss", k, loss, exact.loss, [r.loss for r in forward_runs],
                      forward=True)]
    for name, value in new_state.items():
        forward = name not in trainable
        checks.append(compare(name, k, value, exact.state[name],
                              [r.state[name] for r in (forward_runs if forward else rounded)],
                              state[name], forward))
    for name, value in new_opt.items():
        squared = name.rsplit(".", 1)[-1] in SQUARED_STATES
        scale = np.sqrt if squared else np.asarray
        # (the one-ulp variant can nudge an exactly-zero second moment below zero)
        nudged = (lambda v: np.sqrt(np.maximum(v, 0.0))) if squared else np.asarray
        old = opt_state.get(name)
        checks.append(compare(name, k, scale(value), scale(exact.opt_state[name]),
                              [nudged(r.opt_state[name]) for r in rounded],
                              None if old is None else scale(old)))
    return checks


def _pinned_runs(reference, state, opt_state, k, batch, rng, exact, variants, pin=True,
                 replay=None):
    """The float32 `variants` of step `k`, every kink decision pinned to `exact`'s (the
    float64 run, with the C's side replayed where it was): their spread is rounding alone.
    Returns every run and its recorder (`Decisions` too: pinning changes no forward value).
    Unpinned (`pin=False`, the referee before issue #39), each run takes its own branches
    but for the C's side at the near-kink elements of `replay` (c_tensors, near)."""
    recorders = [SideReplay(pin=exact.decisions) if pin else SideReplay(*(replay or ()))
                 for _ in variants]
    runs = [reference.step(state, opt_state, k, batch, rng, torch.float32, v, recorder=r)
            for v, r in zip(variants, recorders)]
    return runs, recorders


def _measured(runs, recorders) -> list:
    """The runs that took float64's branch throughout: the only ones a tolerance may come
    from."""
    return [run for run, r in zip(runs, recorders) if not r.unpinned]


def _flip_patterns(near: list, seed: int):
    """Which near-kink elements to flip: all, then FLIP_PATTERNS random halves."""
    rng = np.random.default_rng(seed)
    yield near
    for _ in range(FLIP_PATTERNS):
        yield [None if m is None else m & (rng.random(m.shape) < 0.5) for m in near]


def _flipped_runs(reference, state, opt_state, k, batch, rng, near, sides):
    """float64 PyTorch's step `k` with the `near` elements whose side is not known (all but
    those `sides` replays) on another side, per flip pattern; and whether some op's side
    could not be forced (its flips are then not measured)."""
    runs, unflipped = [], False
    for pattern in _flip_patterns(near, k):
        recorder = SideReplay(*(sides or ()), flip=pattern)
        runs.append(reference.step(state, opt_state, k, batch, rng, torch.float64,
                                   recorder=recorder))
        unflipped |= bool(recorder.unflipped)
    return runs, unflipped


def _set_kink_effects(judged: list[Check], moved: list[Check], unflipped: bool):
    """Each failed check of `judged` a kink could move gets, as `kink_effect`, how far the
    flipped runs moved (`moved`: the same checks with those runs as the float32 ones)."""
    for check, flipped in zip(judged, moved):
        if not check.ok and not check.forward:
            check.kink_effect = float("inf") if unflipped else flipped.spread


def _branch_differences(recorders) -> list[np.ndarray | None]:
    """Per kink-op call, the elements where some float32 run took another branch than
    float64's: within rounding of their kink, whatever the margin says."""
    masks: list = []
    for r in recorders:
        for i, d in enumerate(r.differs):
            if i >= len(masks):
                masks.append(None)
            if d is not None:
                masks[i] = d if masks[i] is None else (masks[i] | d)
    return masks


def _union(near: list, differs: list) -> list:
    out = list(near)
    for i, d in enumerate(differs):
        if d is None or i >= len(out):
            continue
        if out[i] is None:
            out[i] = d
        elif out[i].size == d.size:
            out[i] = out[i] | d.reshape(out[i].shape)
    return out


def referee(trainer, reference: Reference, batches, seed: int = 0,
            capture: ForwardCapture | None = None, pin: bool = True) -> Verdict:
    """Train `trainer` (the generated C, built with `seed`) on `batches` = [(x..., y)] and
    judge every step against `reference`; the trainer's state moves on as it goes. The
    float32 runs that set each tolerance take float64's branch at every kink (sides.py). With
    `capture` (the trainer's forward tensors, sides.py), PyTorch takes the C's side of each
    near-kink element, in float64 and in the float32 runs alike. `pin=False` leaves the
    float32 runs their own branches, as the referee did before (for comparison:
    benchmarks/referee_tolerance.py)."""
    state = reference.initial_state()
    opt_state: dict[str, np.ndarray] = {}
    rng = seed
    checks, kinks, trajectory, replayed, unreplayed, unpinned = [], {}, [], {}, {}, {}
    jumps = set()  # steps whose forward itself may differ beyond rounding (kinks.value_jumps)
    for k, batch in enumerate(batches, 1):
        exact = reference.step(state, opt_state, k, batch, rng, torch.float64, record=True)
        if not np.isfinite(exact.loss):  # PyTorch itself diverges: nothing to compare with
            return Verdict("diverges", checks, kinks, trajectory=trajectory)
        runs, recorders = _pinned_runs(reference, state, opt_state, k, batch, rng, exact,
                                       FLOAT32_VARIANTS, pin)
        if _overflows(runs[0], exact):  # so does any float32 program: nothing to compare
            return Verdict("diverges", checks, kinks, trajectory=trajectory)
        rounded = _measured(runs, recorders)
        plain = recorders[0].decisions  # PyTorch's own float32 forward, unchanged by the pins
        near = _union(near_masks(exact.decisions, plain), _branch_differences(recorders))
        found = near_kinks(exact.decisions, plain)
        if not found and any(m is not None for m in near):
            found = ["float32 runs took other branches than float64"]
        if found:
            kinks[k] = found
        # the forward of every run is the same whatever branch its backward took (pinning
        # forces none of it), so all of them measure its rounding, unless a value jumps
        if value_jumps(exact.decisions, plain, near):
            jumps.add(k)
        forward_runs = rounded if k in jumps else runs
        loss = trainer.step(*batch)
        sides = None
        if found and capture is not None:  # again, on the C's side of every near kink
            replay = SideReplay(capture.steps[-1], near)
            exact = reference.step(state, opt_state, k, batch, rng, torch.float64,
                                   recorder=replay)
            sides = (capture.steps[-1], near)
            runs, recorders = _pinned_runs(reference, state, opt_state, k, batch, rng,
                                           exact, FLOAT32_VARIANTS, pin, sides)
            rounded = _measured(runs, recorders)
            forward_runs = rounded if k in jumps else runs
            replayed[k] = replay.replayed
            if replay.unreplayed:
                unreplayed[k] = replay.unreplayed
        new_state, new_opt = trainer.parameters(), trainer.optimizer_state()
        trajectory.append((loss, new_state, new_opt))
        trainable = reference.trainable
        judged = _step_checks(k, loss, new_state, new_opt, exact, rounded, state, opt_state,
                              trainable, forward_runs)
        if not all(c.ok for c in judged):  # measure PyTorch's spread again, on more runs
            more_runs, more_recorders = _pinned_runs(reference, state, opt_state, k, batch,
                                                     rng, exact, MORE_FLOAT32_VARIANTS, pin,
                                                     sides)
            recorders += more_recorders
            more = _measured(more_runs, more_recorders)
            more_forward = more if k in jumps else more_runs
            judged = _step_checks(k, loss, new_state, new_opt, exact, rounded + more, state,
                                  opt_state, trainable, forward_runs + more_forward)
        if lost := sorted({u for r in recorders for u in r.unpinned}):
            unpinned[k] = lost
        if ((found and (capture is None or k in unreplayed)) or lost) and \
                any(not c.ok and not c.forward for c in judged):
            flips, unflipped = _flipped_runs(reference, state, opt_state, k, batch, rng, near,
                                             sides)
            _set_kink_effects(judged, _step_checks(k, loss, new_state, new_opt, exact, flips,
                                                   state, opt_state, trainable, flips),
                              unflipped)
        checks += judged
        state, opt_state = new_state, new_opt  # teacher forcing: go on from the C's state
        rng = getattr(trainer, "rng_state", exact.rng_state)
    xs = batches[-1][:-1]
    exact = reference.evaluate(state, xs, record=True)
    rounded = [reference.evaluate(state, xs, torch.float32, v, record=(i == 0))
               for i, v in enumerate(FLOAT32_VARIANTS)]
    if _not_finite_where(rounded[0].output, exact.output):
        return Verdict("diverges", checks, kinks, trajectory=trajectory)
    found = near_kinks(exact.decisions, rounded[0].decisions)
    if found:
        kinks[0] = found
        if value_jumps(exact.decisions, rounded[0].decisions,
                       near_masks(exact.decisions, rounded[0].decisions)):
            jumps.add(0)
    output = trainer.predict(*xs)
    check = compare("predict", 0, output, exact.output, [r.output for r in rounded], forward=True)
    if not check.ok:
        rounded += [reference.evaluate(state, xs, torch.float32, v)
                    for v in MORE_FLOAT32_VARIANTS]
        check = compare("predict", 0, output, exact.output, [r.output for r in rounded],
                        forward=True)
    checks.append(check)
    # a step whose near-kink elements the C's side was not replayed at, or whose float32
    # runs took branches that could not be pinned (their spread is not rounding alone)
    undecided = {k for k in kinks if capture is None or k == 0 or k in unreplayed} | \
        set(unpinned)
    failures = [c for c in checks if not c.ok]
    if not failures:
        status = "match"
    elif all(_excused(c, undecided, jumps) for c in failures):
        status = "near kink"
    else:
        status = "mismatch"
    return Verdict(status, checks, kinks, trajectory=trajectory, prediction=output,
                   replayed=replayed, unreplayed=unreplayed, unpinned=unpinned)


def _excused(check: Check, undecided: set, jumps: set) -> bool:
    """Whether a failed check may be a kink's doing: its step is undecided, the check is of
    a value a kink can move, and it fails by no more than a kink moves it. A branch taken
    differently moves the backward alone (ReLU's value is continuous at 0, a pool's maximum
    at a tie), so the forward's values (the loss, the running statistics, predict's output)
    are judged as they are unless an op whose value jumps sat near its kink
    (kinks.VALUE_JUMPS); the rest may fail by FLIP_FACTOR times `kink_effect`, no more."""
    if check.step not in undecided:
        return False
    if check.forward:
        return check.step in jumps
    return check.error <= check.tolerance + FLIP_FACTOR * check.kink_effect


def kinks_along(reference: Reference, batches, seed: int = 0) -> dict[int, list[str]]:
    """The near-kink elements (kinks.py) of PyTorch's own float64 run over `batches`, by
    step (0: the eval pass after it): data to avoid when choosing a test's batches."""
    state, opt_state, rng, found = reference.initial_state(), {}, seed, {}
    for k, batch in enumerate(batches, 1):
        exact = reference.step(state, opt_state, k, batch, rng, torch.float64, record=True)
        rounded = reference.step(state, opt_state, k, batch, rng, torch.float32, record=True)
        if near := near_kinks(exact.decisions, rounded.decisions):
            found[k] = near
        state, opt_state, rng = exact.state, exact.opt_state, exact.rng_state
    xs = batches[-1][:-1]
    near = near_kinks(reference.evaluate(state, xs, record=True).decisions,
                      reference.evaluate(state, xs, torch.float32, record=True).decisions)
    if near:
        found[0] = near
    return found


def judge(model, batches, optimizer, out_dir, loss: str = "cross_entropy", seed: int = 0,
          **compile_options) -> Verdict:
    """Compile `model` for the host, build it with its arena poisoned (every byte 0xFF, so
    that a read of memory nothing wrote gives NaN) and referee it over `batches`."""
    from ..api import compile as ub_compile

    *xs, y = batches[0]

    def build(directory, instruments=()):
        pkg = ub_compile(model, tuple(xs), y, loss=loss, optimizer=optimizer,
                         out_dir=directory, instruments=instruments, **compile_options)
        return pkg, pkg.build(seed=seed, arena_fill=0xFF)

    pkg, trainer = build(out_dir)
    reference = Reference(model, optimizer, loss, pkg.trainable)
    verdict = referee(trainer, reference, batches, seed)
    if verdict.status != "near kink":
        return verdict
    # undecided: again with the C's forward tensors, its side of every near kink replayed
    pkg, trainer = build(Path(out_dir).with_name(Path(out_dir).name + "_sides"), [CallTrace()])
    capture = ForwardCapture(trainer, pkg)
    try:
        return referee(trainer, reference, batches, seed, capture)
    finally:
        capture.close()
