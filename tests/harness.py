"""What test modules share: the referee's verdict on a whole model ("trains like PyTorch"),
running a C build over batches and comparing two builds bit for bit, the cross targets'
tool check, and small data makers.

A test whose question is "does the generated C train this model as PyTorch does?" asks the
fidelity referee (`assert_trains_like_torch`), not a PyTorch loop of its own: the referee runs
every step in float64 PyTorch and derives each tensor's tolerance from float32 PyTorch's own
spread on that model and step, and it compares the change each step makes (small gradients
under large weights stay visible), the optimizer state and the eval-mode output too.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub
import ubitrain.api as ub_api
from ubitrain.api import Package
from ubitrain.fidelity.referee import Verdict, judge
from ubitrain.runtime.target_build import missing_tools
from ubitrain.targets import TARGETS, get_target
from ubitrain.zoo import ZOO

CROSS = [name for name, t in TARGETS.items() if not t.runs_on_host]


# ---- the referee ------------------------------------------------------------------------------
@dataclass
class Judged:
    """A match, and what the C computed on the way (`Verdict.trajectory`: per step the loss,
    the state_dict and the optimizer state after it)."""

    verdict: Verdict
    # the build judged, and its trainer after the last step (the first build, where the
    # referee also built a traced one to decide a near kink)
    package: Package
    trainer: object

    @property
    def losses(self) -> list[float]:
        return [loss for loss, _, _ in self.verdict.trajectory]

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        return self.verdict.trajectory[-1][1]

    @property
    def optimizer_state(self) -> dict[str, np.ndarray]:
        return self.verdict.trajectory[-1][2]


@contextlib.contextmanager
def _recording_builds():
    """(package, trainer) of each build inside the block, in order (the referee compiles and
    builds its own)."""
    built, original = [], Package.build

    def build(self, *args, **kwargs):
        trainer = original(self, *args, **kwargs)
        built.append((self, trainer))
        return trainer

    Package.build = build
    try:
        yield built
    finally:
        Package.build = original


@contextlib.contextmanager
def _compiling(compiled):
    """Inside the block, `ub.compile` compiles `compiled` whatever model it is given (None:
    the model given). The referee compiles the model it runs in PyTorch; this lets a test
    judge an ONNX export, or the same layers under another forward, against a module."""
    if compiled is None:
        yield
        return
    calls, original = [], ub_api.compile

    def compile_instead(model, *args, **kwargs):
        calls.append(model)
        return original(compiled, *args, **kwargs)

    ub_api.compile = compile_instead
    try:
        yield
    finally:
        ub_api.compile = original
    # loud, should the referee stop compiling through ubitrain.api.compile: the test would
    # otherwise judge the module's own build and pass without looking at `compiled`
    assert calls, "the referee did not compile through ubitrain.api.compile"


def assert_trains_like_torch(model, batches, optimizer, out_dir, *, loss: str = "cross_entropy",
                             seed: int = 0, compiled=None, **compile_options) -> Judged:
    """Compile a copy of `model` into `out_dir` (with `compile_options`: trainable, target,
    micro_batches, disable_passes...), train it through the C over `batches` = [(x..., y)]
    with `optimizer` and the Dropout generator at `seed`, and have the referee judge every
    step and the final eval-mode output against PyTorch. Fails with the verdict's summary
    (the checks that failed, with PyTorch's spread and the tolerance) unless it is a match,
    or if a check's tolerance is not finite (a check that could not fail). `compiled`: what
    to compile instead of `model` (an ONNX file exported from it; a module with its state
    under another forward), judged against `model` all the same."""
    with _recording_builds() as built, _compiling(compiled):
        verdict = judge(copy.deepcopy(model), batches, optimizer, out_dir, loss=loss, seed=seed,
                        **compile_options)
    assert verdict.status == "match", f"the C does not train like PyTorch: {verdict.summary()}"
    unbounded = [str(c) for c in verdict.checks if not np.isfinite(c.tolerance)]
    assert not unbounded, f"checks that could not fail: {unbounded}"
    assert built, "the referee built no package"
    return Judged(verdict, *built[0])


def torch_steps_with_frozen_rows(model, batches, optimizer_factory, rows: dict[str, int]):
    """A channel-sparse update in float64 PyTorch, which the referee cannot judge (it trains
    whole parameters): `rows` maps a parameter to how many of its leading rows train; the
    other rows, and every parameter not named, are put back after each step (exact for an
    elementwise optimizer). The losses, and the state_dict after the last step."""
    ref = copy.deepcopy(model).double()
    initial = copy.deepcopy(ref.state_dict())
    optimizer = optimizer_factory(ref.parameters())
    losses = []
    for *xs, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ref(*[x.double() for x in xs]), y)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p[rows.get(name, 0):] = initial[name][rows.get(name, 0):]
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in ref.state_dict().items()}


# ---- C builds against each other --------------------------------------------------------------
def run_trainer(trainer, batches) -> list[tuple]:
    """A step per batch; per step the loss, parameters and optimizer state after it (the shape
    of `Verdict.trajectory`)."""
    out = []
    for batch in batches:
        loss = trainer.step(*batch)
        out.append((loss, trainer.parameters(), trainer.optimizer_state()))
    return out


def train_build(pkg: Package, batches, seed: int = 0) -> list[tuple]:
    """Build `pkg` (for any target) and `run_trainer` it over `batches`."""
    trainer = pkg.build(seed=seed)
    try:
        return run_trainer(trainer, batches)
    finally:
        getattr(trainer, "close", lambda: None)()  # an emulated trainer's process


def assert_same_training(got: list[tuple], want: list[tuple]):
    """Two runs (`run_trainer` / `Judged.verdict.trajectory`) agree bit for bit at every step:
    the loss, every parameter and buffer, every optimizer state tensor."""
    assert len(got) == len(want), f"{len(got)} steps != {len(want)}"
    for step, ((loss_a, state_a, opt_a), (loss_b, state_b, opt_b)) in enumerate(zip(got, want),
                                                                                1):
        assert loss_a == loss_b, f"step {step}: loss {loss_a!r} != {loss_b!r}"
        for what, a, b in (("state", state_a, state_b), ("optimizer state", opt_a, opt_b)):
            assert a.keys() == b.keys(), f"step {step}: {what} names differ"
            for name in a:
                assert np.array_equal(a[name], b[name]), f"step {step}: {what} {name}"


def assert_pass_changes_no_bit(model, batches, optimizer, pass_name: str, out_dir,
                               **compile_options) -> tuple[Judged, Package]:
    """A rewrite of the declared pipeline (ubitrain.pipeline) that claims to change no bit:
    with it on, the C trains like PyTorch (`assert_trains_like_torch`); switched off, it
    trains the same bit for bit, every step's loss and state and the final eval-mode output.
    The judged build (pass on) and the package with the pass off, for the pass's own checks
    (calls, arena)."""
    others = tuple(compile_options.pop("disable_passes", ()))
    on = assert_trains_like_torch(model, batches, optimizer, Path(out_dir) / "on",
                                  disable_passes=others, **compile_options)
    *xs, y = batches[0]
    off = ub.compile(copy.deepcopy(model), tuple(xs), y, optimizer=optimizer,
                     out_dir=Path(out_dir) / "off", disable_passes=(pass_name, *others),
                     **compile_options)
    trainer = off.build()
    try:
        assert_same_training(run_trainer(trainer, batches), on.verdict.trajectory)
        output = trainer.predict(*batches[-1][:-1])
    finally:
        getattr(trainer, "close", lambda: None)()
    assert np.array_equal(output, on.verdict.prediction), "predict differs"
    return on, off


# ---- cross targets ----------------------------------------------------------------------------
def skip_or_fail(message: str):
    """A tool the test needs is missing: skip locally, fail in CI (CI=true), where
    scripts/setup.sh has installed every one."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_tools(target_name: str):
    """The target's cross compiler and emulator, or `skip_or_fail`."""
    missing = missing_tools(get_target(target_name))
    if missing:
        skip_or_fail(f"target {target_name}: {', '.join(missing)} not installed "
                     "(scripts/setup.sh)")


# ---- data and errors --------------------------------------------------------------------------
def run_cli(*args, cwd=None):
    """`python -m ubitrain.cli ARGS` in a fresh process; its CompletedProcess (text)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ubitrain.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def small_bn_cnn():
    """A conv with BatchNorm, ReLU and a max pool before a Linear: 8x8 in, 10 classes."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10))


def batches(shape, classes, steps=3, seed=0):
    """`steps` random (input, class label) pairs for a classifier: inputs of `shape` (the batch
    first), labels in [0, classes)."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen), torch.randint(0, classes, (shape[0],),
                                                              generator=gen))
            for _ in range(steps)]


def zoo_case(name: str, batch: int, steps: int, seed: int = 1):
    """The zoo model `name` in training mode, its initial weights drawn from `seed`, and
    `steps` batches of `batch` random samples for it."""
    entry = ZOO[name]
    torch.manual_seed(seed)
    model = entry.factory().train()
    return model, batches((batch, *entry.sample_shape), entry.classes, steps, seed)


def rel_err(got, want) -> float:
    """max |got - want| over max |want| (at least 1e-6), over the whole tensor."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.max(np.abs(got - want), initial=0.0) / max(np.max(np.abs(want), initial=0.0),
                                                                1e-6))
