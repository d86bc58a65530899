"""`memory_budget=`: parse a budget and make the arena fit it.

When the unconstrained arena is larger than the budget, `fit_budget` picks, per candidate
buffer of the training step, keep / page / recompute with the MILP of remat_milp.py,
rewrites the step (program/remat.py) and places the arena again. The MILP counts bytes
alive, not the placement's fragmentation, so when the placed arena still exceeds the budget
the MILP's limit is tightened by the excess and it is solved again. When no plan fits, the
error states the smallest budget that does: the arena of the least-memory plan, placed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from ..errors import CompileError, warn
from ..program.ir import Program
from ..program.remat import check_transient, find_candidates, rewrite
from ..targets import Target
from .cost_model import KernelWork
from .plan import MemoryPlan, plan_memory
from .remat_milp import BudgetProblem

UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2,
         "gb": 1000**3, "gib": 1024**3}
SOLVE_SECONDS = 20.0  # no new attempt (MILP solve + placement) starts after this
ATTEMPTS = 8  # MILP solves with a tightened limit when fragmentation overshoots the budget
CANDIDATE_FRACTION = 256  # buffers smaller than the largest / this are always kept


def parse_bytes(budget) -> int:
    if isinstance(budget, int) and budget > 0:
        return budget
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(budget))
    if not m or m.group(2).lower() not in UNITS:
        raise CompileError(f"memory_budget={budget!r} is not a size; give bytes (262144) or a "
                           "string such as '256KiB' or '1.5MB'")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


@dataclass
class BudgetReport:
    """What fitting a budget did: the choices, their cost and how sure the solver is."""

    budget_bytes: int
    unconstrained_arena: int
    arena_bytes: int
    profile: str
    step_seconds: float  # one plain step in the cost model
    extra_seconds: float = 0.0  # recomputation + paging in the cost model
    bound_seconds: float = 0.0  # the solver's lower bound on extra_seconds
    gap: float = 0.0
    optimal: bool = True
    solve_seconds: float = 0.0
    attempts: int = 0
    counts: dict = field(default_factory=dict)  # decision -> candidates
    paged_bytes: int = 0
    recomputed_bytes: int = 0
    replayed_calls: int = 0
    # micro-batching (memory/micro_batching.py): k, the cost of running k micro-batches
    # instead of one batch (accumulation and k times the per-call costs), the accumulators
    micro_batches: int = 1
    micro_batch_seconds: float = 0.0
    accumulator_bytes: int = 0

    @property
    def overhead(self) -> float:
        extra = self.extra_seconds + self.micro_batch_seconds
        return extra / self.step_seconds if self.step_seconds else 0.0

    def summary(self) -> str:
        micro = ""
        if self.micro_batches > 1:
            micro = (f"{self.micro_batches} micro-batches with gradient accumulation "
                     f"({self.accumulator_bytes:,} B of accumulators, +"
                     f"{self.micro_batch_seconds / self.step_seconds:.1%} time); ")
        if not self.attempts and self.micro_batches > 1:
            return (f"memory budget {self.budget_bytes:,} B: {micro}arena "
                    f"{self.arena_bytes:,} B (one batch: {self.unconstrained_arena:,} B); "
                    f"nothing recomputed or paged")
        if not self.attempts:
            return (f"memory budget {self.budget_bytes:,} B: the unconstrained arena "
                    f"({self.unconstrained_arena:,} B) fits; nothing recomputed or paged")
        gap = "optimal" if self.optimal and self.gap < 1e-6 else f"gap {self.gap:.1%}"
        return (f"memory budget {self.budget_bytes:,} B: {micro}arena {self.arena_bytes:,} B "
                f"({'one batch' if micro else 'unconstrained'} "
                f"{self.unconstrained_arena:,} B); recompute "
                f"{self.counts.get('recompute', 0)} buffers ({self.recomputed_bytes:,} B, "
                f"{self.replayed_calls} calls run again), page "
                f"{self.counts.get('page', 0)} ({self.paged_bytes:,} B); extra cost "
                f"{self.overhead:.1%} of a step in the {self.profile} cost model "
                f"({gap}, {self.solve_seconds:.2f} s, {self.attempts} MILP solve(s))")


def check_budget(plan: MemoryPlan, budget) -> None:
    """Refuse a budget below the unconstrained arena (without rematerialization)."""
    limit = parse_bytes(budget)
    if plan.arena_bytes > limit:
        raise CompileError(
            f"memory_budget={budget!r} ({limit:,} bytes) is below this model's arena of "
            f"{plan.arena_bytes:,} bytes at this batch size; the smallest budget that works "
            f"without rematerialization is {plan.arena_bytes:,} bytes (lower bound "
            f"{plan.lower_bound_bytes:,}); use a smaller batch or a larger budget")


def fit_budget(train: Program, predict: Program, plan: MemoryPlan, library, budget,
               target: Target, batch: int) -> tuple[Program, MemoryPlan]:
    """The training program and plan whose emitted arena is at most `budget` bytes."""
    limit = parse_bytes(budget)
    work = KernelWork(library)
    profile = target.cost
    report = BudgetReport(limit, plan.arena_bytes, plan.arena_bytes, profile.name,
                          work.step_seconds(train, profile))
    if plan.arena_bytes <= limit:
        plan.budget = report
        return train, plan
    start = time.perf_counter()
    largest = max((s.nbytes for s in train.lifetimes()), default=0)
    candidates = find_candidates(train, max(plan.alignment, largest // CANDIDATE_FRACTION))
    problem = BudgetProblem(train, candidates, work, profile, plan.alignment)
    persistent = plan.persistent_bytes
    predict_need = _predict_arena(predict, plan.alignment, persistent)
    # The MILP bounds bytes alive; the placed arena may exceed them by its fragmentation. Try
    # the budget itself, then tighten by the excess until a plan fits (down to the
    # least-memory plan), then search between the tightest limit that fitted and the
    # loosest that did not: the cost falls as the limit loosens.
    def attempt(solution):
        report.attempts += 1
        program, new_plan = _realise(train, predict, solution.choices, plan.alignment, limit)
        return program, new_plan, solution

    fits_at, fails_at, best, least, least_tried = None, limit - persistent, None, None, None
    peak = fails_at
    for _ in range(ATTEMPTS if predict_need <= limit else 0):
        left = SOLVE_SECONDS - (time.perf_counter() - start)
        if left <= 0:
            break
        solution = problem.solve(peak, left) if peak > 0 else None
        if solution is None:  # below what any plan reaches: the least-memory plan
            least = problem.least_memory(max(left, 5.0))
            if least is None or least.peak >= fails_at:
                break
            peak, solution = int(least.peak), least
        tried = attempt(solution)
        if solution is least:
            least_tried = tried
        if tried[1].arena_bytes <= limit:
            fits_at, best = peak, tried
            if peak == limit - persistent or solution is least:
                break
        else:  # below the failed plan's own peak, so that the next plan differs
            fails_at = min(peak, int(solution.peak) - plan.alignment)
            if solution is least:
                break
        if fits_at is None:
            peak = min(peak - (tried[1].arena_bytes - limit), fails_at)
        elif fails_at - fits_at <= plan.alignment:
            break
        else:
            peak = (fits_at + fails_at) // 2
    if best is not None:
        return best[0], _finish(best[1], report, best[2], best[0], start)
    if least is None:
        least = problem.least_memory(max(SOLVE_SECONDS - (time.perf_counter() - start), 5.0))
    smallest = plan.arena_bytes
    if least is not None:
        program, new_plan, _ = least_tried or attempt(least)
        if new_plan.arena_bytes <= limit:
            return program, _finish(new_plan, report, least, program, start)
        smallest = new_plan.arena_bytes
    return _too_small(budget, limit, batch, target, plan, max(smallest, predict_need))


class BudgetTooSmall(CompileError):
    """No plan fits the budget; `smallest_bytes` is the least budget that does."""

    def __init__(self, message: str, smallest_bytes: int):
        super().__init__(message)
        self.smallest_bytes = smallest_bytes


def _too_small(budget, limit, batch, target, plan, smallest):
    raise BudgetTooSmall((
        f"memory_budget={budget!r} ({limit:,} bytes) is too small for this model at batch "
        f"{batch} on target {target.name!r}: the smallest budget that works is {smallest:,} "
        f"bytes (the unconstrained arena is {plan.arena_bytes:,} bytes, of which "
        f"{plan.persistent_bytes:,} are parameters, buffers and optimizer state, which never "
        f"leave the arena). Use memory_budget of at least {smallest:,} bytes, a smaller batch, or "
        f"ub.SparseUpdate to train fewer parameters"), smallest)


def _predict_arena(predict: Program, alignment: int, persistent: int) -> int:
    """The arena `predict` needs on its own: the least any budget can be."""
    alone = plan_memory([predict], alignment)
    return persistent + alone.arena_bytes - alone.persistent_bytes


def _realise(train, predict, choices, alignment, limit=0):
    program, decisions = rewrite(train, choices)
    try:
        check_transient(program)
    except AssertionError as err:
        raise CompileError(f"internal error in the budget rewrite: {err}") from None
    return program, plan_memory([program, predict], alignment, decisions, limit)


def _finish(new_plan, report, solution, program, start) -> MemoryPlan:
    report.arena_bytes = new_plan.arena_bytes
    report.extra_seconds, report.bound_seconds = solution.cost, solution.bound
    report.gap, report.optimal = solution.gap, solution.optimal
    report.solve_seconds = time.perf_counter() - start
    for cand, how in solution.choices.items():
        kind = "recompute" if how.startswith("recompute") else how
        report.counts[kind] = report.counts.get(kind, 0) + 1
        if how == "page":
            report.paged_bytes += cand.nbytes
        elif how.startswith("recompute"):
            report.recomputed_bytes += cand.nbytes
    report.replayed_calls = sum("replay_of" in c.attrs for c in program.calls)
    if not solution.optimal:
        warn(f"the budget MILP stopped at its time limit; the plan used is within "
             f"{solution.gap:.1%} of the best bound ({report.summary()})")
    new_plan.budget = report
    return new_plan
