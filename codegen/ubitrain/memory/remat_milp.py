"""The budget MILP: per candidate buffer, keep it, page it out and back, or recompute it.

POET's formulation (docs/algorithms.md) has binary R/S_RAM/S_SD/M_in/M_out per stage × node
and lets the solver reorder the whole step. Over ubitrain's step program (hundreds of calls,
BatchNorm decomposed into elementwise kernels) that is far too large to solve in seconds, so
this one keeps the program's order and coarsens both axes:

* nodes: the candidates of program/remat.py, each a buffer with one gap (u, v) between two
  uses (for an activation, the end of its forward use to its first backward use), larger
  than `min_bytes`;
* stages: the calls, merged where the same set of gaps covers them (only the largest live
  byte count of a merged run matters).

Variables, per candidate i: keep_i, page_i and rc_id (recompute with the replay of depth d,
program/remat.py) ∈ {0, 1}, exactly one of them 1; away_i = page_i + Σ_d rc_id. Constraints:
  * memory at every stage t:  L(t) − Σ_{i: u_i < t < v_i} away_i·bytes_i ≤ B,
    where L(t) is the aligned bytes alive at call t in the unconstrained program (in-place
    sharing and early updates included);
  * memory while a replay runs, at the boundary just before v_i:
    P(v_i) − Σ_{j away there} away_j·bytes_j + rc_id·temp_id ≤ B;
  * a replay that reads candidate j as it is needs j kept over v_i: rc_id ≤ keep_j.
Objective (POET's): Σ rc_id·compute(replay_id) + Σ page_i·(page_out_i + page_in_i), each
k times for a candidate inside a micro-batch loop (program/micro_batch.py).

The solver is HiGHS through `scipy.optimize.milp` with a time limit; when it stops early the
best plan found is used and the remaining gap (best bound vs plan) is reported. The same rows
with B replaced by a variable M and the objective min M give the least memory any plan of
this space reaches (the feasibility minimum behind the "smallest budget" message).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from ..program.ir import Program
from ..program.micro_batch import call_repeats
from ..program.remat import MAX_DEPTH, Candidate, recompute_choice
from .arena_planner import align_up
from .cost_model import CostProfile, KernelWork


@dataclass
class Solution:
    choices: dict  # Candidate -> "keep" | "page" | "recompute"
    cost: float  # seconds of extra work in the cost model
    bound: float  # the solver's proven lower bound on the cost
    gap: float  # (cost - bound) / cost, 0 when proven optimal
    optimal: bool
    seconds: float
    peak: float  # the model's transient peak under this plan (bytes)


class BudgetProblem:
    STRIDE = 2 + MAX_DEPTH  # variables per candidate: keep, page, rc depth 1..MAX_DEPTH

    def __init__(self, program: Program, candidates: list[Candidate], work: KernelWork,
                 profile: CostProfile, alignment: int):
        self.cands = candidates
        self.profile, self.work = profile, work
        n = len(program.calls)
        sizes = {s: align_up(s.nbytes, alignment) for s in program.lifetimes()}
        live = np.zeros(n + 1)
        boundary = np.zeros(n + 1)  # bytes alive across the boundary before call t
        for s, (a, b) in program.lifetimes().items():
            live[a:b + 1] += sizes[s]
            boundary[a + 1:b + 1] += sizes[s]
        self.live, self.boundary = live[:n], boundary
        self.bytes = np.array([align_up(c.nbytes, alignment) for c in candidates], float)
        self.step_seconds = work.step_seconds(program, profile)
        repeats = call_repeats(program)  # a candidate in a micro-batch loop: k times the cost
        self.page_cost = np.array([repeats[c.v] * (profile.page_out(c.nbytes)
                                                   + profile.page_in(c.nbytes))
                                   for c in candidates])
        self.rc_cost = np.zeros((len(candidates), MAX_DEPTH))
        for i, c in enumerate(candidates):
            for r in c.replays:
                self.rc_cost[i, r.depth - 1] = work.seconds(
                    [program.calls[w] for w in r.calls], profile, repeats[c.v])
        self._rows = self._memory_rows(n)

    def var(self, i: int, option: int) -> int:
        """Column of candidate i's option: 0 keep, 1 page, 1 + d recompute at depth d."""
        return self.STRIDE * i + option

    def cost_of(self, i: int, how: str) -> float:
        if how == "keep":
            return 0.0
        if how == "page":
            return float(self.page_cost[i])
        return float(self.rc_cost[i, self.cands[i].replay_for(how).depth - 1])

    # ---- rows ---------------------------------------------------------------------------
    def _memory_rows(self, n):
        """Stage rows (candidates away over the whole stage, its most live bytes) merged by
        the set of gaps covering them, and replay rows (i, depth, candidates away at v_i,
        bytes alive across the boundary before v_i)."""
        k = len(self.cands)
        stages: dict[tuple, float] = {}
        starts = sorted({c.u + 1 for c in self.cands} | {c.v for c in self.cands} | {0})
        for a, b in zip(starts, starts[1:] + [n]):
            if a >= b:
                continue
            active = tuple(i for i in range(k) if self.cands[i].u < a and b <= self.cands[i].v)
            stages[active] = max(stages.get(active, 0.0), float(self.live[a:b].max()))
        replays = []
        for i, c in enumerate(self.cands):
            away = [j for j, d in enumerate(self.cands) if d.u < c.v < d.v]
            for r in c.replays:
                replays.append((i, r, away, float(self.boundary[c.v])))
        return list(stages.items()), replays

    def _away(self, i) -> list[int]:
        return [self.var(i, o) for o in range(1, self.STRIDE)]

    def _coefficient_rows(self):
        """(coefficients {column: bytes}, bytes alive) of every memory row."""
        stages, replays = self._rows
        rows = []
        for active, need in stages:
            rows.append(({col: self.bytes[i] for i in active for col in self._away(i)}, need))
        for i, r, away, need in replays:
            coefs = {col: self.bytes[j] for j in away for col in self._away(j)}
            coefs[self.var(i, 1 + r.depth)] = -float(r.temp_bytes)
            rows.append((coefs, need))
        return rows

    def peak(self, choices: dict) -> float:
        """The model's transient peak (bytes) under `choices`."""
        away = [choices.get(c, "keep") != "keep" for c in self.cands]
        stages, replays = self._rows
        best = max((need - sum(self.bytes[i] for i in active if away[i])
                    for active, need in stages), default=0.0)
        for i, r, aw, need in replays:
            how = choices.get(self.cands[i], "keep")
            if how.startswith("recompute") and self.cands[i].replay_for(how) is r:
                best = max(best, need - sum(self.bytes[j] for j in aw if away[j])
                           + r.temp_bytes)
        return max(best, 0.0)

    def _matrix(self, extra_col: bool):
        k = len(self.cands)
        nvar = self.STRIDE * k + (1 if extra_col else 0)
        a_rows, lo, hi = [], [], []
        for i in range(k):  # exactly one choice
            row = np.zeros(nvar)
            row[self.var(i, 0):self.var(i, self.STRIDE)] = 1
            a_rows.append(row), lo.append(1), hi.append(1)
        index = {id(c): i for i, c in enumerate(self.cands)}
        for i, c in enumerate(self.cands):  # a replay reads its dependencies in the arena
            for r in c.replays:
                for d in r.deps:
                    if id(d) not in index:
                        continue  # not in this problem: always kept
                    row = np.zeros(nvar)
                    row[self.var(i, 1 + r.depth)], row[self.var(index[id(d)], 0)] = 1, -1
                    a_rows.append(row), lo.append(-np.inf), hi.append(0)
        return nvar, a_rows, lo, hi

    def _bounds(self, nvar):
        upper = np.ones(nvar)
        for i, c in enumerate(self.cands):
            for depth in range(len(c.replays) + 1, MAX_DEPTH + 1):
                upper[self.var(i, 1 + depth)] = 0
        return upper

    def _cost_vector(self, nvar):
        cost = np.zeros(nvar)
        for i in range(len(self.cands)):
            cost[self.var(i, 1)] = self.page_cost[i]
            for d in range(MAX_DEPTH):
                cost[self.var(i, 2 + d)] = self.rc_cost[i, d]
        return cost

    # ---- solving ------------------------------------------------------------------------
    def solve(self, budget: float, time_limit: float = 20.0) -> Solution | None:
        """Least-cost plan with the transient peak ≤ `budget` bytes, or None if none exists."""
        start = time.perf_counter()
        if not self.cands:
            peak = float(self.live.max(initial=0.0))
            return Solution({}, 0.0, 0.0, 0.0, True, 0.0, peak) if peak <= budget else None
        nvar, a_rows, lo, hi = self._matrix(False)
        for coefs, need in self._coefficient_rows():
            rhs = need - budget  # bytes that must be away at this stage
            if rhs <= 0 and all(v >= 0 for v in coefs.values()):
                continue  # holds whatever the choices
            if not coefs:
                return None
            row = np.zeros(nvar)
            for j, v in coefs.items():
                row[j] = v
            a_rows.append(row), lo.append(rhs), hi.append(np.inf)
        res = milp(self._cost_vector(nvar),
                   constraints=LinearConstraint(np.array(a_rows), lo, hi),
                   integrality=np.ones(nvar), bounds=Bounds(0, self._bounds(nvar)),
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-6})
        seconds = time.perf_counter() - start
        if res.x is None:
            return None
        return self._solution(res, seconds)

    def _solution(self, res, seconds) -> Solution:
        choices = {}
        for i, c in enumerate(self.cands):
            x = res.x[self.var(i, 0):self.var(i, self.STRIDE)]
            option = int(np.argmax(x))
            choices[c] = ("keep", "page")[option] if option < 2 else recompute_choice(option - 1)
        cost = sum(self.cost_of(i, choices[c]) for i, c in enumerate(self.cands))
        bound = getattr(res, "mip_dual_bound", None)
        bound = cost if bound is None or not np.isfinite(bound) else min(float(bound), cost)
        gap = 0.0 if cost <= 0 else max(0.0, (cost - bound) / cost)
        return Solution(choices, cost, bound, gap, res.status == 0, seconds, self.peak(choices))

    def least_memory(self, time_limit: float = 20.0) -> Solution | None:
        """The plan with the smallest transient peak this space allows (cost second)."""
        start = time.perf_counter()
        if not self.cands:
            return None
        nvar, a_rows, lo, hi = self._matrix(True)
        m = nvar - 1
        floor = 0.0
        for coefs, need in self._coefficient_rows():
            if not coefs:
                floor = max(floor, need)
                continue
            row = np.zeros(nvar)
            for j, v in coefs.items():
                row[j] = v
            row[m] = 1
            a_rows.append(row), lo.append(need), hi.append(np.inf)
        cost = np.zeros(nvar)
        cost[m] = 1.0
        upper = self._bounds(nvar)
        upper[m] = np.inf
        res = milp(cost, constraints=LinearConstraint(np.array(a_rows), lo, hi),
                   integrality=np.r_[np.ones(nvar - 1), 0], bounds=Bounds(
                       np.r_[np.zeros(nvar - 1), floor], upper),
                   options={"time_limit": time_limit})
        if res.x is None:
            return None
        least = float(res.x[m])
        # Among the least-memory plans, the cheapest one.
        best = self.solve(np.ceil(least), time_limit)
        if best is None:
            best = self._solution(res, 0.0)
        best.seconds = time.perf_counter() - start
        return best
