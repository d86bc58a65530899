"""Judging a mutant: the model compiled and built with the defect, then `judge`d."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import re
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ubitrain.api as ub_api
from ubitrain.errors import RuntimeStatusError
from ubitrain.fidelity.kinks import FLOAT32_EPS
from ubitrain.fidelity.referee import FLOOR, SPREAD_FACTOR, _excused, judge, referee
from ubitrain.fidelity.sides import ForwardCapture
from ubitrain.package import Package
from ubitrain.pipeline import CallTrace

from ..fuzzing.case import first_difference
from .defects import BASELINE, Mutant
from .reuse import FirstStepOnly, SharedReference

MARK = "/* mutant: {} */\n"


@dataclass
class MutantResult:
    mutant: str
    exercised: bool  # the defect found something to change in this model
    where: str  # what it changed
    # the verdict ("match", "mismatch", "near kink"), "stops" (the C returned an error
    # status: a non-finite loss), "unchanged" (not caught, and every number the referee
    # reads is bit for bit the C as generated's: the defect changes nothing on this data),
    # "below rounding" (not caught, and every such number within the referee's rounding
    # floor of the C as generated's: `within_rounding`), "below float32's error" (not
    # caught, and every number as close to float64 as float32 PyTorch's or the C as
    # generated's: `effect`), "not exercised", or "error" (anything else went wrong)
    status: str
    summary: str = ""

    @classmethod
    def of(cls, mutant: str, where: str | None, status: str, summary: str):
        """The result of a run in which the defect changed `where` (None: nothing)."""
        if where is None and status == "error" and not summary:
            status = "not exercised"
        return cls(mutant, where is not None, where or "nothing to change", status, summary)

    @property
    def caught(self) -> bool:
        """`judge` told the mutant from a correct C: a mismatch, or a C that stops."""
        return self.exercised and self.status in ("mismatch", "stops")


@contextlib.contextmanager
def mutated(mutant: Mutant):
    """Inside the block, every package built has the mutant's defect (its model.c rewritten
    before the build; the compile instrumented); yields a list that gets, per build, what
    was changed (None: nothing to change)."""
    changes: list = []
    build, compile_ = Package.build, ub_api.compile

    def build_mutated(self, *args, **kwargs):
        if mutant.rewrite is not None:
            model_c = Path(self.out_dir) / "model.c"
            text = model_c.read_text()
            mark = MARK.format(mutant.name)
            if not text.startswith(mark):
                done = mutant.rewrite(text)
                changes.append(None if done is None else done[1])
                if done is not None:
                    model_c.write_text(mark + done[0])
        return build(self, *args, **kwargs)

    def compile_mutated(model, *args, instruments=(), **kwargs):
        if mutant.instrument is None:
            return compile_(model, *args, instruments=instruments, **kwargs)
        hook = mutant.instrument()
        pkg = compile_(model, *args, instruments=[*instruments, hook], **kwargs)
        changes.append(hook.where)
        return pkg

    Package.build, ub_api.compile = build_mutated, compile_mutated
    try:
        yield changes
    finally:
        Package.build, ub_api.compile = build, compile_


def judge_mutant(mutant: Mutant, model, batches, optimizer, out_dir, **options) -> MutantResult:
    """`judge` on `model` built with `mutant`."""
    with mutated(mutant) as changes:
        try:
            verdict = judge(copy.deepcopy(model), batches, optimizer, out_dir, **options)
            status, summary = verdict.status, verdict.summary()
        except RuntimeStatusError as err:  # a C that stops is a C told apart
            status, summary = "stops", str(err)[:400]
        except Exception as err:  # noqa: BLE001 - said in the result
            status = "error"
            summary = "".join(traceback.format_exception_only(type(err), err)).strip()[:400]
    exercised = bool(changes) and all(c is not None for c in changes)
    where = "; ".join(dict.fromkeys(c for c in changes if c)) or "nothing to change"
    if not exercised:
        status = "not exercised"
    return MutantResult(mutant.name, exercised, where, status, summary)


def look(pkg, reference, batches, seed: int = 0, sides: bool = False, pin: bool = True):
    """One of `judge`'s looks, on a fresh build of `pkg` (compiled with CallTrace on the
    host): the referee; with `sides`, the C's sides of near-kink elements replayed. (judge
    builds the first look without the trace; the trace hook unset, the step is the same.)"""
    trainer = pkg.build(seed=seed, arena_fill=0xFF)
    capture = ForwardCapture(trainer, pkg) if sides else None
    try:
        return referee(trainer, reference, batches, seed, capture, pin=pin)
    finally:
        if capture is not None:
            capture.close()
        if not pkg.target.runs_on_host:  # the emulator's process
            trainer.close()


def decide(pkg, reference, batches, seed: int = 0, pin: bool = True):
    """`judge`'s two looks: the referee; where it says "near kink", again with the C's
    sides replayed. Under emulation (a cross target) there is no trace hook to read the
    C's forward from: "near kink" stays."""
    verdict = look(pkg, reference, batches, seed, pin=pin)
    if verdict.status != "near kink" or not pkg.target.runs_on_host:
        return verdict
    return look(pkg, reference, batches, seed, sides=True, pin=pin)


def first_step_mismatch(pkg, reference, batches, seed: int = 0):
    """`decide` on the first step alone: its verdict when a check of that step fails and
    nothing there can excuse it, else None. The referee computes step 1 the same way
    however many steps follow, so such a failure makes the whole run a mismatch (unless
    PyTorch diverges or the C stops at a later step), and the later steps, whose PyTorch
    runs start from the mutant's state and are its alone, need not run. Where look 1 leaves
    step 1 "near kink", look 2 (the C's sides replayed) decides, as `decide` does."""
    first = FirstStepOnly(reference)
    verdict = look(pkg, first, batches[:1], seed)
    if _unexcused_at_step_1(verdict, replayed=False):
        return _at_step_1(verdict)
    if 1 not in verdict.near_kinks or not pkg.target.runs_on_host:
        return None
    verdict = look(pkg, first, batches[:1], seed, sides=True)
    return _at_step_1(verdict) if _unexcused_at_step_1(verdict, replayed=True) else None


def _unexcused_at_step_1(verdict, replayed: bool) -> bool:
    """A failed check of step 1 that `referee._excused` could not excuse, were step 1's
    forward values allowed to jump (not known here: counted as allowed, which only ever
    excuses more)."""
    near = verdict.unreplayed if replayed else verdict.near_kinks
    undecided = {1} & (set(near) | set(verdict.unpinned))
    return any(c.step == 1 and not c.ok and not _excused(c, undecided, undecided)
               for c in verdict.checks)


def _at_step_1(verdict):
    return dataclasses.replace(
        verdict, status="mismatch", checks=[c for c in verdict.checks if c.step == 1],
        near_kinks={k: v for k, v in verdict.near_kinks.items() if k == 1}, prediction=None)


def within_rounding(a, b) -> bool:
    """Whether every number verdict `b`'s C computed (each step's loss, state and optimizer
    state; predict's output) is within FLOOR float32 roundings of the largest value of the
    same tensor of `a`'s: the floor `referee.compare` grants any float32 program, so no
    referee with float32 tolerances can tell `b`'s C from `a`'s. (A defect whose effect the
    data shrink below rounding: on gru_kws, a stale read that reaches the gradient only
    through the first of 49 time steps, moving it by 4e-10 of its largest value.)"""
    def close(x, y) -> bool:
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return x.shape == y.shape and bool(np.all(
            np.abs(x - y) <= FLOOR * FLOAT32_EPS * np.max(np.abs(x), initial=0.0)))

    if len(a.trajectory) != len(b.trajectory):
        return False
    for (loss_a, *parts_a), (loss_b, *parts_b) in zip(a.trajectory, b.trajectory):
        if not close(loss_a, loss_b) or any(
                pa.keys() != pb.keys() or not all(close(pa[n], pb[n]) for n in pa)
                for pa, pb in zip(parts_a, parts_b)):
            return False
    if a.prediction is None or b.prediction is None:
        return a.prediction is None and b.prediction is None
    return close(a.prediction, b.prediction)


def effect(verdict, baseline=None) -> tuple[float, str]:
    """How far verdict's C is from float64, in units of float32 PyTorch's own error: the
    largest error / spread over its checks (a check within its rounding floor counts 0; inf:
    a number float32 computes exactly, the C not), and which. With `baseline` (the C as
    generated, a match), each check's ratio is taken over that C's own where it is above 1:
    a defect is measured beyond what the C as generated already is. At most 1: no number is
    further from float64 than float32 PyTorch's or the C as generated's is, so no referee
    comparing with float32 could call it wrong; from 1 to SPREAD_FACTOR: a miss within the
    referee's headroom; beyond: a hole. (A defect scaling a gradient by 1.01 where float32
    itself computes it to 1%: mobilenet_v2 at batch 1, whose last BatchNorms normalise four
    nearly equal values.) Each step is judged from the C's own state, as the referee judges
    it: comparing a mutant's numbers with the C as generated's would count, at step 2, how
    far rounding-sensitive channels drift apart from two different states."""
    own = {} if baseline is None else {(c.step, c.name): _ratio(c) for c in baseline.checks}
    return max(((_ratio(c) / max(1.0, own.get((c.step, c.name), 0.0)),
                 f"step {c.step} {c.name}") for c in verdict.checks), default=(0.0, "no check"))


def _ratio(check) -> float:
    """A check's error / spread; 0 within its rounding floor."""
    if check.error <= check.tolerance - SPREAD_FACTOR * check.spread:
        return 0.0
    return check.error / check.spread if check.spread > 0 else float("inf")


# A large model's kernels are in model_kernels_<n>.c besides model.c (its train step): a
# rewrite reads them all as one text, each file after a line naming it
_FILE = "\n/* mutants: file {} */\n"
_FILE_LINE = re.compile(r"\n/\* mutants: file (\S+) \*/\n")


def c_sources(project: Path) -> dict[str, str]:
    names = ["model.c"] + sorted(f.name for f in project.glob("model_kernels_*.c"))
    return {n: (project / n).read_text() for n in names}


def _joined(sources: dict[str, str]) -> str:
    return "".join(_FILE.format(n) + text for n, text in sources.items())


def _split(text: str) -> dict[str, str]:
    parts = _FILE_LINE.split(text)
    return dict(zip(parts[1::2], parts[2::2]))


def rewritten(pkg, mutant: Mutant, project: Path):
    """A copy of `pkg`'s project in `project` with `mutant`'s rewrite of its C (model.c and
    its kernel files): (the package there, what was changed), or (None, None) when the
    rewrite finds nothing. A `project` that holds an earlier mutant of the same package
    (judge_mutants gives each package one) is kept: the files that differ are written and
    their objects deleted, so that its build compiles those alone, not the runtime again
    (on a small model, most of a build)."""
    done = mutant.rewrite(_joined(c_sources(Path(pkg.out_dir))))
    if done is None:
        return None, None
    if not (project / "model.c").exists():
        shutil.copytree(pkg.out_dir, project, ignore=shutil.ignore_patterns("build*"))
    for name, text in _split(done[0]).items():
        text = MARK.format(mutant.name) + text if name == "model.c" else text
        if (project / name).read_text() != text:
            for stale in project.glob(f"build*/CMakeFiles/*/{name}.o"):
                stale.unlink()  # written within make's timestamp resolution, it may look current
            (project / name).write_text(text)
    return dataclasses.replace(pkg, out_dir=project), done[1]


def judge_mutants(mutants, model, batches, optimizer, out_dir, loss: str = "cross_entropy",
                  seed: int = 0, every_step: bool = False, **options) -> list[MutantResult]:
    """Every mutant of `mutants` on `model`, `judge`d as `judge_mutant` does, faster: the
    model is compiled once and each C mutant is a copy of that project, rewritten and built
    (a compile mutant compiles again); PyTorch's runs of the first step are shared
    (reuse.py), and a mutant whose first step is a mismatch nothing excuses is not run
    further (`first_step_mismatch`; `every_step` runs every mutant through every step, as
    `judge` does). A mutant not caught is "unchanged" when its steps and prediction are bit
    for bit those of BASELINE (listed before it), "below rounding" when they are within
    rounding of them (`within_rounding`)."""
    out_dir = Path(out_dir)
    *xs, y = batches[0]
    options = dict(options, loss=loss, optimizer=optimizer)
    # the trace hook (look 2's) runs on the host alone
    trace = [CallTrace()] if options.get("target", "host") == "host" else []
    pkg = ub_api.compile(copy.deepcopy(model), tuple(xs), y, out_dir=out_dir / "base",
                         instruments=trace, **options)
    reference = SharedReference(copy.deepcopy(model), optimizer, loss, pkg.trainable)
    results, baseline = [], None
    for mutant in mutants:
        where, status, summary = None, "error", ""
        try:
            if mutant.rewrite is not None:
                mutant_pkg, where = rewritten(pkg, mutant, out_dir / "mutant")
            else:
                hook = mutant.instrument()
                mutant_pkg = ub_api.compile(copy.deepcopy(model), tuple(xs), y,
                                            out_dir=out_dir / mutant.name,
                                            instruments=[*trace, hook], **options)
                where = hook.where
            if where is not None:
                verdict, note = None, ""
                if mutant is not BASELINE and not every_step and len(batches) > 1:
                    verdict = first_step_mismatch(mutant_pkg, reference, batches, seed)
                    note = "\n  (decided at step 1: the later steps not run)" if verdict else ""
                verdict = verdict or decide(mutant_pkg, reference, batches, seed)
                status, summary = verdict.status, verdict.summary() + note
                if mutant is BASELINE:
                    baseline = verdict
                elif status in ("match", "near kink") and baseline is not None:
                    if first_difference(baseline, verdict) is None:
                        status = "unchanged"
                    elif within_rounding(baseline, verdict):
                        status = "below rounding"
                    elif effect(verdict, baseline)[0] <= 1.0:
                        status = "below float32's error"
                    else:  # a miss: by how much float32's own error it was missed
                        summary += ("\n  the C is {:.2f}x float32 PyTorch's own error (or "
                                    "the C as generated's) from float64 at most ({})"
                                    ).format(*effect(verdict, baseline))
        except RuntimeStatusError as err:  # a C that stops is a C told apart
            status, summary = "stops", str(err)[:400]
        except Exception as err:  # noqa: BLE001 - said in the result
            summary = "".join(traceback.format_exception_only(type(err), err)).strip()[:400]
        results.append(MutantResult.of(mutant.name, where, status, summary))
    return results
