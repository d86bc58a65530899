"""Training under a memory budget: cost of ubitrain's plan from the unconstrained arena down to
the smallest feasible budget, next to Chen et al.'s checkpointing and the MILP optimum.

    python benchmarks/budget_sweep.py [--models ...] [--batch 8] [--targets host cortex-m4]
                                      [--points 8] [--out results/budget_sweep.json]

For each zoo model, target cost profile (memory/cost_model.py) and budget:

* ubitrain: `fit_budget` as `ub.compile(memory_budget=)` runs it: the MILP, the rewrite of
  the step, the arena placed again (retrying with a tighter MILP limit when fragmentation
  overshoots). overhead = extra cost / one plain step in the cost model; arena = the placed
  arena (<= budget); solve = wall time of the whole search on this machine.
* MILP optimum: the same MILP (same candidates, graph and cost model) solved once at the
  budget minus the persistent state, i.e. without the fragmentation margin; `bound` is the
  lower bound HiGHS proves (equal to the optimum when it closes the gap). ubitrain's plan
  can only cost more than this, because the placed arena must also fit.
* Chen et al. (2016) checkpointing on the same candidates and cost model: forward
  activations in forward order, every k-th kept as a checkpoint, the others dropped after
  their forward use and recomputed once per segment when the backward reaches the segment
  (the segment's forward calls run again once; its activations then live until their last
  backward use). `chen_sqrt` is k = ceil(sqrt(n)); `chen_best` is the cheapest k whose
  peak fits the budget (no paging, no fragmentation margin: a bound in its favour).
* The smallest feasible budget is the placed arena of the least-memory plan (the number the
  infeasible-budget error states); the sweep spaces `--points` budgets evenly from the
  unconstrained arena down to it.
* With micro-batching (memory/micro_batching.py, what `ub.compile(memory_budget=)` runs when
  micro_batches is not given): at the same budgets, and further down to the smallest budget
  over every k (the `--mb-points` budgets below the k = 1 smallest only micro-batching can
  meet), the k chosen, its arena and its overhead (micro-batching + recompute + page, over
  one plain step at k = 1 in the same cost model). A model with BatchNorm takes k > 1 only
  where k = 1 cannot fit (its batch statistics would change); `mb_k` shows where it does.
"""

import argparse
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from ubitrain.api import lower
from ubitrain.errors import CompileError
from ubitrain.memory.budget import CANDIDATE_FRACTION, BudgetTooSmall, fit_budget
from ubitrain.memory.cost_model import KernelWork
from ubitrain.memory.micro_batching import fit_micro_batched
from ubitrain.memory.remat_milp import BudgetProblem
from ubitrain.program.remat import find_candidates
from ubitrain.targets import get_target
from ubitrain.training.batch_coupling import batch_coupled_layers
from ubitrain.zoo import ZOO


def Lowered(name, batch, target, k=1):
    """The step at k micro-batches, as fit_micro_batched takes it (the pipeline's unit)."""
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    return lower(entry.factory(), (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                 target=target, micro_batches=k)


def programs(name, batch, target):
    low = Lowered(name, batch, target)
    return low.train, low.predict, low.library, low.plan


def micro_batched(first, relower, budget, target, batch):
    """(k, arena, overhead) that the compile's search picks, or the smallest budget over
    every k when nothing fits."""
    coupled = bool(batch_coupled_layers(first.model, first.tm))
    try:
        _, _, plan = fit_micro_batched(first, relower, budget, target, batch, None, coupled)
    except BudgetTooSmall as err:
        return err.smallest_bytes
    return plan.micro_batches, plan.arena_bytes, plan.budget.overhead


def chen_plans(problem: BudgetProblem, train):
    """(k, peak bytes, extra seconds) of every checkpoint spacing k on forward activations."""
    cands = problem.cands
    forward = sorted((i for i, c in enumerate(cands) if c.root.kind == "activation"
                      and c.replays), key=lambda i: cands[i].u)
    n = len(forward)
    plans = []
    for k in range(1, n + 1):
        dropped = [i for pos, i in enumerate(forward) if pos % k != 0] if k > 1 else []
        segments = [forward[s:s + k][1:] for s in range(0, n, k)]
        live = problem.live.copy()
        cost = 0.0
        for seg in segments:
            if not seg:
                continue
            back = min(cands[i].v for i in seg)  # the segment is recomputed at its first use
            calls = set()
            for i in seg:
                c = cands[i]
                live[c.u + 1:back] -= problem.bytes[i]
                calls.update(c.replays[0].calls)
            cost += problem.work.seconds([train.calls[w] for w in sorted(calls)],
                                         problem.profile)
        plans.append((k, float(live.max()), cost, len(dropped)))
    return plans


def sweep(name, batch, target, points, mb_points):
    first = Lowered(name, batch, target)
    train, predict, library, plan = first.train, first.predict, first.library, first.plan
    cache = {1: first}

    def relower(k):  # each k is traced and lowered once per sweep
        if k not in cache:
            cache[k] = Lowered(name, batch, target, k)
        return cache[k]
    alignment = plan.alignment
    arena, persistent = plan.arena_bytes, plan.persistent_bytes
    largest = max(s.nbytes for s in train.lifetimes())
    cands = find_candidates(train, max(alignment, largest // CANDIDATE_FRACTION))
    problem = BudgetProblem(train, cands, KernelWork(library), get_target(target).cost, alignment)
    try:
        fit_budget(train, predict, plan, library, 1, get_target(target), batch)
        raise AssertionError("a 1-byte budget fitted")
    except CompileError as err:
        smallest = int(str(err).split("smallest budget that works is ")[1].split(" ")[0]
                       .replace(",", ""))
    mb_smallest = micro_batched(first, relower, 1, target, batch)
    chen = chen_plans(problem, train)
    sqrt_k = max(1, math.ceil(math.sqrt(max(len(chen), 1))))
    budgets = list(np.linspace(arena, smallest, points).astype(int))
    if mb_smallest < smallest:  # below the k = 1 smallest: micro-batching only
        budgets += list(np.linspace(smallest, mb_smallest, mb_points + 1).astype(int))[1:]
    for budget in budgets:
        budget = int(budget)
        start = time.perf_counter()
        mb = micro_batched(first, relower, budget, target, batch)
        mb = mb if isinstance(mb, tuple) else None
        mb_seconds = time.perf_counter() - start
        row = dict(model=name, batch=batch, target=target, budget=budget,
                   budget_over_arena=round(budget / arena, 4), unconstrained_arena=arena,
                   smallest=smallest, mb_smallest=mb_smallest,
                   mb_k=None if mb is None else mb[0], mb_arena=None if mb is None else mb[1],
                   mb_overhead=None if mb is None else mb[2],
                   mb_solve_seconds=round(mb_seconds, 3), chen_sqrt_k=sqrt_k, arena=None,
                   overhead=None, recompute=0, page=0, solve_seconds=None,
                   milp_overhead=None, milp_bound_overhead=None, chen_best_overhead=None)
        if budget < smallest:  # no keep / recompute / page plan at k = 1
            yield row
            continue
        start = time.perf_counter()
        _, fitted = fit_budget(train, predict, plan, library, budget, target, batch)
        seconds = time.perf_counter() - start
        rep = fitted.budget
        opt = problem.solve(budget - persistent, 25.0)
        fits = [c for c in chen if c[1] + persistent <= budget]
        best = min(fits, key=lambda c: c[2]) if fits else None
        sq = chen[sqrt_k - 1] if chen else None
        row.update(arena=fitted.arena_bytes, overhead=rep.overhead,
                   recompute=rep.counts.get("recompute", 0),
                   page=rep.counts.get("page", 0), solve_seconds=round(seconds, 3),
                   milp_attempts=rep.attempts,
                   milp_overhead=None if opt is None else opt.cost / rep.step_seconds,
                   milp_bound_overhead=None if opt is None else opt.bound / rep.step_seconds,
                   milp_gap=None if opt is None else opt.gap,
                   milp_seconds=None if opt is None else round(opt.seconds, 3),
                   chen_best_overhead=None if best is None else best[2] / rep.step_seconds,
                   chen_best_k=None if best is None else best[0],
                   chen_sqrt_k=sqrt_k,
                   chen_sqrt_peak=None if sq is None else int(sq[1] + persistent),
                   chen_sqrt_overhead=None if sq is None else sq[2] / rep.step_seconds,
                   candidates=len(cands))
        yield row


def _pct(v):
    return "    -" if v is None else f"{100 * v:5.1f}%"


def _num(v, fmt=","):
    return "-" if v is None else format(v, fmt)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--targets", nargs="+", default=["host", "cortex-m4"])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--mb-points", type=int, default=3,
                        help="budgets below the k = 1 smallest, down to the smallest over k")
    parser.add_argument("--out", type=Path, default=Path("results/budget_sweep.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    print(f"{'model':<19}{'b':>2} {'target':<10}{'budget':>10} {'/arena':>6} {'arena':>10} "
          f"{'ubitrain':>8} {'MILP opt':>8} {'bound':>7} {'Chen best':>9} {'rc':>3} {'pg':>3} "
          f"{'solve s':>7} {'mb k':>4} {'mb arena':>10} {'mb cost':>7}")
    for name in args.models:
        for batch in args.batch:
            for target in args.targets:
                for r in sweep(name, batch, target, args.points, args.mb_points):
                    rows.append(r)
                    print(f"{name:<19}{batch:>2} {target:<10}{r['budget']:>10,} "
                          f"{r['budget_over_arena']:>6.3f} {_num(r['arena']):>10} "
                          f"{_pct(r['overhead']):>8} {_pct(r['milp_overhead']):>8} "
                          f"{_pct(r['milp_bound_overhead']):>7} "
                          f"{_pct(r['chen_best_overhead']):>9} {r['recompute']:>3} "
                          f"{r['page']:>3} {_num(r['solve_seconds'], '.2f'):>7} "
                          f"{_num(r['mb_k']):>4} {_num(r['mb_arena']):>10} "
                          f"{_pct(r['mb_overhead']):>7}", flush=True)
                sq = next(r for r in rows[::-1] if r["model"] == name and r["batch"] == batch
                          and r["target"] == target and r["arena"] is not None)
                print(f"  Chen sqrt(n): k={sq['chen_sqrt_k']}, peak {sq['chen_sqrt_peak']:,} B "
                      f"({sq['chen_sqrt_peak'] / sq['unconstrained_arena']:.3f} of the arena), "
                      f"overhead {_pct(sq['chen_sqrt_overhead'])}; smallest feasible "
                      f"{sq['smallest']:,} B ({sq['smallest'] / sq['unconstrained_arena']:.3f}), "
                      f"with micro-batching {sq['mb_smallest']:,} B "
                      f"({sq['mb_smallest'] / sq['unconstrained_arena']:.3f})", flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
