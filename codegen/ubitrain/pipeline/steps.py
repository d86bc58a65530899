"""What a pipeline is made of: steps, some of which are rewrites that can be switched off.

A `Step` transforms the compilation unit (pipeline/unit.py) in place: tracing the model,
legalizing Relax into kernels, walking the graph into step programs, planning memory. A
`Rewrite` is a step that changes how the training step is computed, never what: with it off
the model trains the same, only slower or in more memory. It states

  * `requires`: its precondition, checked on the unit (the program it would rewrite, the
    target, the micro-batch count), returning why it cannot run or None. A rewrite whose
    precondition does not hold does nothing; the unit records that it was skipped and why.
  * `after`: the rewrites it builds on (it runs only where they ran).
  * `bit_exact`: the claim that switching it off gives the same step bit for bit. The
    fuzzer holds every such claim to its word (two builds compared bit for bit).

`ub.compile(disable_passes=...)` names rewrites; an unknown name is an error for every
precision. Instruments (pipeline/instruments.py) watch every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import CompileError


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable  # run(unit): transforms the unit in place
    summary: str = ""
    phase: str = ""  # the progress bar's label for the steps from here on


def always(unit) -> str | None:
    return None


@dataclass(frozen=True)
class Rewrite(Step):
    requires: Callable = always  # requires(unit) -> None, or why the rewrite cannot run
    after: tuple[str, ...] = ()  # rewrites this one builds on
    bit_exact: bool = True  # off, the step is the same bit for bit


@dataclass(frozen=True)
class Pipeline:
    """The declared sequence of one precision: `lowering` runs once per micro-batch count
    (a memory budget may lower the step again at another count), `finishing` once."""

    precision: str
    lowering: tuple[Step, ...]
    finishing: tuple[Step, ...]
    check_options: Callable  # check_options(loss=, micro_batches=): what it cannot do
    checked_optimizer: Callable  # the optimizer it trains with (None: its default)

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.lowering + self.finishing

    @property
    def rewrites(self) -> tuple[Rewrite, ...]:
        return tuple(s for s in self.steps if isinstance(s, Rewrite))

    @property
    def bit_exact(self) -> tuple[str, ...]:
        """The rewrites that claim bit-exactness."""
        return tuple(r.name for r in self.rewrites if r.bit_exact)

    def disabled(self, names) -> frozenset[str]:
        """`disable_passes` checked against this pipeline's rewrites."""
        names = (names,) if isinstance(names, str) else tuple(names or ())
        known = [r.name for r in self.rewrites]
        unknown = [n for n in names if n not in known]
        if unknown:
            listed = ", ".join(known) or "none"
            raise CompileError(f"disable_passes: unknown pass {', '.join(map(repr, unknown))} "
                               f"for precision={self.precision!r}; its passes are: {listed}")
        return frozenset(names)


def run_steps(steps, unit, progress=None):
    """Run `steps` over `unit` and return it (a step may return another unit to go on
    with: the budget's at another micro-batch count). Each rewrite runs only where it is
    switched on, the rewrites it builds on ran, and its precondition holds; the unit's
    instruments see every step that ran."""
    for step in steps:
        if progress is not None and step.phase:
            progress(step.phase)
        if isinstance(step, Rewrite):
            reason = _why_not(step, unit)
            if reason is not None:
                unit.skipped[step.name] = reason
                continue
        unit = step.run(unit) or unit
        if isinstance(step, Rewrite):
            unit.ran.add(step.name)
        for instrument in unit.instruments:
            instrument.after(step, unit)
    return unit


def _why_not(rewrite: Rewrite, unit) -> str | None:
    if rewrite.name in unit.disabled:
        return "switched off"
    missing = [a for a in rewrite.after if a not in unit.ran]
    if missing:
        return f"builds on {', '.join(missing)}, which did not run"
    return rewrite.requires(unit)
