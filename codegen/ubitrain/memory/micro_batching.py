"""The fourth answer to a memory budget: k micro-batches with gradient accumulation.

Splitting the batch B into k micro-batches of B/k (program/micro_batch.py) divides the
activations a step keeps by about k, at the price of one accumulator per trained parameter
and of running every call of the body k times. `fit_micro_batched` tries the divisors k of
B in increasing order; at each it lowers the step at B/k and fits the budget there with the
keep / recompute / page MILP (budget.py), whose costs count the loop's calls k times. The
plan of least total cost in the cost model wins:

    cost(k) = step(k) + extra(k),  step(k) = k × (body at B/k) + zeroing + update,

so the micro-batching overhead step(k) − step(1) (the accumulation and k − 1 more of every
call's fixed cost, cost_model.py) is weighed against recomputation and paging. Once some k
fits with nothing recomputed or paged, no larger k is tried: step(k) grows with k. When no
k fits, the error states the smallest budget over every k.

Micro-batching changes what batch-coupled layers compute (BatchNorm's batch statistics are
per micro-batch), while keep / recompute / page give the very same bits. So for a model
with BatchNorm, k > 1 is used only when no plan at k = 1 fits, and then the smallest k that
fits (the statistics closest to the batch's); the user is warned.
"""

from __future__ import annotations

import time

from ..errors import CompileError
from ..program.ir import Program
from ..targets import Target
from ..training.batch_coupling import divisors
from .cost_model import KernelWork

SEARCH_SECONDS = 60.0  # no new k is lowered after this once some k fits


def accumulator_bytes(program: Program) -> int:
    return sum(s.nbytes for s in program.lifetimes() if s.kind == "accumulator")


def fit_micro_batched(first, relower, budget, target: Target, batch: int,
                      forced: int | None = None, coupled: bool = False,
                      splittable: bool = True):
    """The lowered step (`first`, at k = forced or 1, or one `relower(k)` returns) and its
    plan, fitted to `budget`: (lowered, train program, plan). `coupled`: the model has
    batch-coupled layers (BatchNorm), so k > 1 is tried only when k = 1 cannot fit;
    `splittable`: False when the inputs share no batch dimension (only k = 1)."""
    from .budget import BudgetTooSmall, fit_budget, parse_bytes  # scipy: only under a budget

    limit = parse_bytes(budget)
    profile = target.cost
    first_k = forced or 1
    ks = [first_k] if forced else divisors(batch) if splittable else [1]
    fitted, smallest = [], {}
    start = time.perf_counter()
    for k in ks:
        if fitted and time.perf_counter() - start > SEARCH_SECONDS:
            break
        try:
            low = first if k == first_k else relower(k)
        except CompileError:  # the model does not trace at B/k (a batch fixed in a reshape)
            continue
        try:
            train, plan = fit_budget(low.train, low.predict, low.plan, low.library, budget,
                                     target, batch)
        except BudgetTooSmall as err:
            smallest[k] = err.smallest_bytes
            continue
        step = KernelWork(low.library).step_seconds(low.train, profile)
        fitted.append((step + plan.budget.extra_seconds, k, low, train, plan, step))
        if not plan.budget.attempts or coupled:  # a larger k only costs more, or changes
            break  # what BatchNorm computes
    if not fitted:
        _too_small(budget, limit, batch, target, first, smallest, forced, splittable)
    _, k, low, train, plan, step = min(fitted, key=lambda f: (f[0], f[1]))
    if k > 1:
        one = first if first_k == 1 else relower(1)
        base = KernelWork(one.library).step_seconds(one.train, profile)
        report = plan.budget
        report.micro_batches, report.step_seconds = k, base
        report.micro_batch_seconds = step - base
        report.accumulator_bytes = accumulator_bytes(train)
        report.unconstrained_arena = one.plan.arena_bytes
    return low, train, plan


def _too_small(budget, limit, batch, target, first, smallest: dict, forced, splittable):
    from .budget import BudgetTooSmall

    least = min(smallest, key=lambda k: (smallest[k], k))
    how = (f"with {least} micro-batches of {batch // least} samples" if least > 1
           else "without micro-batching")
    if forced:
        space, advice = (f"with micro_batches={forced}, recomputation and paging",
                         "leave micro_batches=None to let the compiler choose it, ")
    elif not splittable:
        space, advice = ("with recomputation and paging (micro-batching needs every input "
                         "and the labels to have the batch as dimension 0)"), ""
    else:
        space, advice = "even with micro-batching, recomputation and paging", ""
    tried = ", ".join(f"k={k}: {b:,}" for k, b in smallest.items())
    raise BudgetTooSmall(
        f"memory_budget={budget!r} ({limit:,} bytes) is too small for this model at batch "
        f"{batch} on target {target.name!r} {space}: the smallest budget that works is "
        f"{smallest[least]:,} bytes ({how}; smallest per number of micro-batches k: "
        f"{tried}; {first.plan.persistent_bytes:,} bytes are parameters, buffers and "
        f"optimizer state, which never leave the arena). Use memory_budget of at least "
        f"{smallest[least]:,} bytes, {advice}or ub.SparseUpdate to train fewer parameters",
        smallest[least])
