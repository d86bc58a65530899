"""The budget MILP: per candidate buffer, keep it, page it out and back, or recompute it.

POET's formulation (ALGORITHMS.md §2) has binary R/S_RAM/S_SD/M_in/M_out per stage × node
and lets the solver reorder the whole step. Over ubitrain's step program (hundreds of calls,
BatchNorm decomposed into elementwise kernels) that is far too large to solve in seconds, so
this one keeps the program's order and coarsens both axes:

* nodes: the candidates of program/remat.py, each a buffer with one gap (u, v) between two
  uses (for an activation, the end of its forward use to its first backward use), larger
  than `min_bytes`;
* stages: the calls, merged where the same set of gaps covers them (only the largest live
  byte count of a merged run matters).

Variables, per candidate i: keep_i, page_i, rc_i ∈ {0, 1} with keep_i + page_i + rc_i = 1
(rc_i fixed to 0 when no replay exists). Constraints:
  * memory at every stage t:  L(t) − Σ_{i: u_i < t < v_i} (page_i + rc_i)·bytes_i ≤ B,
    where L(t) is the aligned bytes alive at call t in the unconstrained program (in-place
    sharing and early updates included);
  * memory while a replay runs, at the boundary just before v_i:
    P(v_i) − Σ_{j away there} (page_j + rc_j)·bytes_j + rc_i·temp_i ≤ B;
  * a replay that reads candidate j as it is needs j kept over v_i: rc_i ≤ keep_j.
Objective (POET's): Σ rc_i·compute(replay_i) + Σ page_i·(page_out_i + page_in_i).

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
from ..program.remat import Candidate
from .cost_model import CostProfile, KernelWork
from .greedy_planner import align_up


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
        self.step_seconds = work.program(program) * profile.seconds_per_iteration
        self.page_cost = np.array([profile.page_out(c.nbytes) + profile.page_in(c.nbytes)
                                   for c in candidates])
        self.rc_cost = np.array([(sum(work(program.calls[w]) for w in c.replay)
                                  * profile.seconds_per_iteration) if c.replay is not None
                                 else 0.0 for c in candidates])
        for c, w in zip(candidates, self.rc_cost):
            c.replay_work = int(round(w / profile.seconds_per_iteration)) if c.replay else 0
        self._rows = self._memory_rows(n)

    # ---- rows ---------------------------------------------------------------------------
    def _memory_rows(self, n):
        """Stage rows (candidates away over the whole stage, its most live bytes) merged by
        the set of gaps covering them, and replay rows (i, candidates away at v_i, bytes
        alive across the boundary before v_i)."""
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
            if c.replay is not None:
                away = [j for j, d in enumerate(self.cands) if d.u < c.v < d.v]
                replays.append((i, away, float(self.boundary[c.v])))
        return list(stages.items()), replays

    def _coefficient_rows(self):
        """(coefficients {variable: bytes}, bytes alive) of every memory row.

        Variable layout: keep_i = 3i, page_i = 3i + 1, rc_i = 3i + 2."""
        stages, replays = self._rows
        rows = []
        for active, need in stages:
            coefs = {}
            for i in active:
                coefs[3 * i + 1] = coefs[3 * i + 2] = self.bytes[i]
            rows.append((coefs, need))
        for i, away, need in replays:
            coefs = {}
            for j in away:
                coefs[3 * j + 1] = coefs[3 * j + 2] = self.bytes[j]
            coefs[3 * i + 2] = -float(self.cands[i].replay_temp_bytes)
            rows.append((coefs, need))
        return rows

    def peak(self, choices: dict) -> float:
        """The model's transient peak (bytes) under `choices`."""
        away = [choices.get(c, "keep") != "keep" for c in self.cands]
        stages, replays = self._rows
        best = max((need - sum(self.bytes[i] for i in active if away[i])
                    for active, need in stages), default=0.0)
        for i, aw, need in replays:
            if choices.get(self.cands[i]) == "recompute":
                best = max(best, need - sum(self.bytes[j] for j in aw if away[j])
                           + self.cands[i].replay_temp_bytes)
        return max(best, 0.0)

    def _matrix(self, extra_col: bool):
        k = len(self.cands)
        nvar = 3 * k + (1 if extra_col else 0)
        a_rows, lo, hi = [], [], []
        for i in range(k):  # exactly one choice
            row = np.zeros(nvar)
            row[3 * i:3 * i + 3] = 1
            a_rows.append(row), lo.append(1), hi.append(1)
        index = {id(c): i for i, c in enumerate(self.cands)}
        for i, c in enumerate(self.cands):  # a replay reads its dependencies in the arena
            for d in c.deps:
                if id(d) not in index:
                    continue  # not in this problem: always kept
                row = np.zeros(nvar)
                row[3 * i + 2], row[3 * index[id(d)]] = 1, -1
                a_rows.append(row), lo.append(-np.inf), hi.append(0)
        return nvar, a_rows, lo, hi

    def _bounds(self, nvar):
        upper = np.ones(nvar)
        for i, c in enumerate(self.cands):
            if c.replay is None:
                upper[3 * i + 2] = 0
        return upper

    # ---- solving ------------------------------------------------------------------------
    def solve(self, budget: float, time_limit: float = 20.0) -> Solution | None:
        """Least-cost plan with the transient peak ≤ `budget` bytes, or None if none exists."""
        start = time.perf_counter()
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
        cost = np.zeros(nvar)
        cost[1::3] = self.page_cost
        cost[2::3] = self.rc_cost
        if not self.cands:
            return Solution({}, 0.0, 0.0, 0.0, True, 0.0, float(self.live.max()))
        res = milp(cost, constraints=LinearConstraint(np.array(a_rows), lo, hi),
                   integrality=np.ones(nvar), bounds=Bounds(0, self._bounds(nvar)),
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-6})
        seconds = time.perf_counter() - start
        if res.x is None:
            return None
        return self._solution(res, seconds)

    def _solution(self, res, seconds) -> Solution:
        x = np.round(res.x[:3 * len(self.cands)]).astype(int)
        choices = {}
        for i, c in enumerate(self.cands):
            choices[c] = ("keep", "page", "recompute")[int(np.argmax(x[3 * i:3 * i + 3]))]
        cost = float(np.dot(x[1::3], self.page_cost) + np.dot(x[2::3], self.rc_cost))
        bound = getattr(res, "mip_dual_bound", None)
        bound = cost if bound is None or not np.isfinite(bound) else min(float(bound), cost)
        gap = 0.0 if cost <= 0 else max(0.0, (cost - bound) / cost)
        return Solution(choices, cost, bound, gap, res.status == 0, seconds, self.peak(choices))

    def least_memory(self, time_limit: float = 20.0) -> Solution | None:
        """The plan with the smallest transient peak this space allows (cost second)."""
        start = time.perf_counter()
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
        if not self.cands:
            return None
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
