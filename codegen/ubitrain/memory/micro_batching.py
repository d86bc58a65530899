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
import warnings

from ..errors import CompileError, UbitrainWarning
from ..program.ir import Program
from .cost_model import KernelWork, profile_for

SEARCH_SECONDS = 60.0  # no new k is lowered after this once some k fits


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def check_micro_batches(value, example_inputs, labels) -> int:
    """`micro_batches=` as an int k ≥ 1 that divides the batch of every input and the labels."""
    batch = int(example_inputs[0].shape[0]) if example_inputs[0].dim() else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CompileError(f"micro_batches={value!r} must be a whole number of micro-batches "
                           f">= 1 that divides the batch of {batch}; one of "
                           f"{divisors(batch) if batch else [1]}")
    if value == 1:
        return 1
    if not one_batch_dimension(example_inputs, labels):
        rows = [int(t.shape[0]) if t.dim() else None for t in list(example_inputs) + [labels]]
        raise CompileError(f"micro_batches={value} splits dimension 0 of every input and the "
                           f"labels, but their first dimensions are {rows}; give inputs and "
                           f"labels with the same batch first, or micro_batches=1")
    if batch % value:
        raise CompileError(f"micro_batches={value} does not divide the batch of {batch}; use "
                           f"one of {divisors(batch)}")
    return value


def accumulator_bytes(program: Program) -> int:
    return sum(s.nbytes for s in program.lifetimes() if s.kind == "accumulator")


def frequency_scaled_embeddings(model) -> list[str]:
    """Embeddings that scale their gradient by each id's count in the whole batch, which a
    micro-batch cannot see (so micro-batching refuses them rather than train otherwise)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    return [name or "Embedding" for name, m in model.named_modules()
            if isinstance(m, torch.nn.Embedding) and m.scale_grad_by_freq]


def mixes_samples(model, example_inputs) -> bool:
    """Whether a sample's output depends on the other samples of its batch outside
    BatchNorm (`x.mean(0)`, `x[1:]`, `x.T @ x` over the batch): the model in evaluation mode,
    in float64, on a random batch shaped like the example, against the same batch in two
    parts. A model that does not run on the parts counts as mixing."""
    import copy

    import torch

    if len(example_inputs[0].shape) == 0 or example_inputs[0].shape[0] < 2:
        return False
    probe = copy.deepcopy(model).double().eval()
    gen = torch.Generator().manual_seed(0)
    batch = [torch.randn(x.shape, generator=gen, dtype=torch.float64)
             if x.is_floating_point() else x for x in example_inputs]
    try:
        with torch.no_grad():
            whole = probe(*batch)
            parts = torch.cat([probe(*[x[:1] for x in batch]), probe(*[x[1:] for x in batch])])
    except Exception:  # noqa: BLE001 - a model tied to its batch size: it cannot be split
        return True
    if not isinstance(whole, torch.Tensor) or whole.shape != parts.shape:
        return True
    return not torch.allclose(whole, parts, rtol=1e-9, atol=1e-12)


def _one_draw_per_batch(module) -> bool:
    """torchvision's StochasticDepth(mode="batch") drops the whole batch or none of it: a
    micro-batch draws its own (found by name: torchvision is not imported here)."""
    return type(module).__name__ == "StochasticDepth" and getattr(module, "mode", "") == "batch"


def batch_coupled_layers(model, tm, example_inputs=()) -> list[str]:
    """Layers whose training-mode output or gradient depends on the other samples of the
    batch."""
    import torch

    if isinstance(model, torch.nn.Module):
        norm = torch.nn.modules.batchnorm._BatchNorm
        names = [name or type(m).__name__ for name, m in model.named_modules()
                 if isinstance(m, norm) or _one_draw_per_batch(m)]
        names += frequency_scaled_embeddings(model)
        if example_inputs and mixes_samples(model, example_inputs):
            names.append("ops that mix the samples of a batch")
    else:  # an ONNX ModelProto
        names = [n.name or n.op_type for n in getattr(getattr(model, "graph", None), "node", [])
                 if n.op_type == "BatchNormalization"]
    return names or [name for name in tm.buffer_updates]


def warn_batch_coupled(layers: list[str], k: int, batch: int) -> None:
    """Warn that micro-batches of batch / k samples change what `layers` (the
    batch_coupled_layers) compute."""
    if k <= 1 or not layers:
        return
    shown = ", ".join(layers[:4]) + (", ..." if len(layers) > 4 else "")
    warnings.warn(
        f"micro-batching: the step runs {k} micro-batches of {batch // k} samples, so the "
        f"parts of the model that couple samples ({shown}) see one micro-batch at a time, "
        f"not the batch of {batch} (BatchNorm normalises with the statistics of each "
        f"micro-batch and updates its running statistics {k} times per step); training "
        f"differs from full-batch training by more than float rounding. A memory_budget "
        f"that fits without micro-batching (or micro_batches=1) keeps the whole batch.",
        UbitrainWarning, stacklevel=3)


def one_batch_dimension(example_inputs, labels) -> bool:
    """Every input and the labels have the same batch as dimension 0 (what k > 1 splits)."""
    tensors = list(example_inputs) + [labels]
    return all(t.dim() and t.shape[0] == tensors[0].shape[0] for t in tensors)


def fit_micro_batched(first, relower, budget, target: str, batch: int,
                      forced: int | None = None, coupled: bool = False,
                      splittable: bool = True):
    """The lowered step (`first`, at k = forced or 1, or one `relower(k)` returns) and its
    plan, fitted to `budget`: (lowered, train program, plan). `coupled`: the model has
    batch-coupled layers (BatchNorm), so k > 1 is tried only when k = 1 cannot fit;
    `splittable`: False when the inputs share no batch dimension (only k = 1)."""
    from .budget import BudgetTooSmall, fit_budget, parse_bytes  # scipy: only under a budget

    limit = parse_bytes(budget)
    profile = profile_for(target)
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
        f"{batch} on target {target!r} {space}: the smallest budget that works is "
        f"{smallest[least]:,} bytes ({how}; smallest per number of micro-batches k: "
        f"{tried}; {first.plan.persistent_bytes:,} bytes are parameters, buffers and "
        f"optimizer state, which never leave the arena). Use memory_budget of at least "
        f"{smallest[least]:,} bytes, {advice}or ub.SparseUpdate to train fewer parameters",
        smallest[least])
