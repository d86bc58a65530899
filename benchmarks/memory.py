"""Training memory of the zoo: PyTorch on the CPU next to ubitrain's arena and its lower bound.

    python benchmarks/memory.py [--batch 1 8] [--models ...] [--out results/memory.json]

Per model and batch, with SGD (momentum 0.9, so one optimizer state tensor per parameter):

* pytorch_peak: PyTorch's peak training memory on the CPU, measured: one training step
  (zero_grad, forward, cross-entropy, backward, optimizer step, after a warm-up step that
  creates the momentum buffers) runs under torch.profiler with profile_memory=True, and the
  memory timeline of torch.profiler._memory_profiler (every CPU allocation and free,
  categorised as parameter, optimizer state, gradient, activation, temporary, ...) gives the
  most bytes allocated at one moment. The input batch is excluded (ubitrain's caller owns it).
* pytorch_model: the usual accounting, parameters + buffers + gradients + optimizer state +
  the activations autograd saves for the backward pass (summed, each storage once, through
  torch.autograd.graph.saved_tensors_hooks; parameters and the input excluded).
* no_reuse: every buffer of ubitrain's training step with its own memory: persistent state
  plus each activation, gradient, mask and scratch buffer, before in-place sharing.
* before: the arena and lower bound without in-place sharing, placed by TFLite Micro's
  greedy by size (the planner before issue 3).
* arena, lower_bound: ubitrain now (in-place sharing, memory/arena_planner.py). The arena
  holds everything: parameters, buffers, optimizer state and the step's working memory.
* half_pt: ubitrain compiled with memory_budget = half of PyTorch's peak (recomputation and
  paging, memory/budget.py): the arena it reaches and the extra cost of the plan in the
  host cost model (memory/cost_model.py) as a share of one plain step; "infeasible" when
  no plan fits (the error's smallest budget is then given).
* least: the smallest arena any budget reaches (the smallest budget the compiler accepts)
  and its extra cost in the host cost model.
* floor: the persistent state (parameters, BatchNorm buffers, momentum) over PyTorch's peak:
  no plan that trains every parameter in fp32 with this optimizer can use less memory than
  its state, so no budget brings arena/PT below this ratio.
"""

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from tools.greedy_planner import GreedyPlanner
from ubitrain.zoo import ZOO


def _batch(name, batch):
    entry = ZOO[name]
    torch.manual_seed(0)
    return (entry.factory(), torch.randn(batch, *entry.sample_shape),
            torch.randint(0, entry.classes, (batch,)))


def pytorch_memory(name: str, batch: int) -> dict:
    return pytorch_training_memory(*_batch(name, batch))


def pytorch_training_memory(model, x, y) -> dict:
    """PyTorch's peak and accounted training memory of one SGD-momentum step (see above)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfile, MemoryProfileTimeline

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # creates the momentum buffers
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    timeline = MemoryProfileTimeline(MemoryProfile(prof.profiler.kineto_results))
    _, sizes = timeline._coalesce_timeline(torch.device("cpu"))
    # Allocations made before profiling (parameters, momentum) are known to the timeline
    # through their categories; the peak is the largest total at one moment.
    peak = int(np.asarray(sizes).sum(axis=1).max())
    input_bytes = x.numel() * x.element_size() + y.numel() * y.element_size()

    state = {p.untyped_storage().data_ptr() for p in model.parameters()}
    state |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    state.add(x.untyped_storage().data_ptr())
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in state and ptr != 0:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    opt.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return dict(pytorch_peak=max(peak - input_bytes, 0),
                pytorch_model=2 * params + params + buffers + sum(saved.values()),
                pytorch_saved_activations=sum(saved.values()))


def _budgeted(name: str, batch: int, out_dir: Path, budget: int) -> dict:
    """The arena and extra cost of the plan at `budget`, or the smallest budget that works."""
    model, x, y = _batch(name, batch)
    try:
        pkg = ub.compile(model, (x,), y, optimizer=ub.SGD(lr=0.01, momentum=0.9),
                         memory_budget=budget, out_dir=out_dir)
    except ub.CompileError as err:
        smallest = str(err).split("smallest budget that works is ")[1].split(" ")[0]
        return dict(arena=None, overhead=None, smallest=int(smallest.replace(",", "")))
    return dict(arena=pkg.memory_plan.arena_bytes, overhead=pkg.memory_plan.budget.overhead,
                smallest=None)


def budget_points(name: str, batch: int, out_root: Path, pytorch_peak: int) -> dict:
    """At half of PyTorch's peak; and the least memory any plan reaches (at what cost)."""
    half = _budgeted(name, batch, out_root / f"{name}_half", pytorch_peak // 2)
    smallest = half["smallest"] or _budgeted(name, batch, out_root / f"{name}_1", 1)["smallest"]
    least = _budgeted(name, batch, out_root / f"{name}_least", smallest)
    return dict(half_pt_arena=half["arena"], half_pt_overhead=half["overhead"],
                half_pt_smallest=half["smallest"], least_arena=least["arena"],
                least_overhead=least["overhead"])


def ubitrain_memory(name: str, batch: int, out_root: Path) -> dict:
    model, x, y = _batch(name, batch)
    opt = ub.SGD(lr=0.01, momentum=0.9)
    pkg = ub.compile(model, (x,), y, optimizer=opt, out_dir=out_root / f"{name}_b{batch}")
    plan = pkg.memory_plan
    train = pkg.programs["train_step"]
    transient = sum(b.nbytes for b in plan.buffers if b.program == "train_step")
    no_reuse = plan.persistent_bytes + transient + plan.in_place_bytes["train_step"]

    model, x, y = _batch(name, batch)
    before = ub.compile(model, (x,), y, optimizer=opt, out_dir=out_root / f"{name}_b{batch}_0",
                        disable_passes=("share_in_place",))
    greedy_peak, bound = 0, 0
    for prog in before.programs.values():
        greedy = GreedyPlanner(plan.alignment)
        for s, (a, b) in prog.lifetimes().items():
            greedy.add_buffer(s.nbytes, a, b)
        greedy_peak, bound = max(greedy_peak, greedy.arena_size()), max(bound, greedy.lower_bound())
    persistent = before.memory_plan.persistent_bytes
    return dict(arena=plan.arena_bytes, lower_bound=plan.lower_bound_bytes,
                persistent=plan.persistent_bytes, no_reuse=no_reuse,
                in_place_bytes=plan.in_place_bytes["train_step"],
                before_arena=persistent + greedy_peak, before_lower_bound=persistent + bound,
                placement=plan.strategy["train_step"], calls=len(train.calls))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--out", type=Path, default=Path("results/memory.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    header = (f"{'model':<19}{'b':>2} {'PyTorch peak':>13} {'PT model':>11} {'no reuse':>11} "
              f"{'before':>11} {'arena':>11} {'bound':>11} {'in place':>10}  "
              f"{'arena/PT':>8} {'floor':>6} {'noreuse/arena':>13} {'before/LB':>9} "
              f"{'arena/LB':>8}  "
              f"{'budget PT/2: arena, extra cost; least arena, extra cost'}")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for batch in args.batch:
                r = dict(model=name, batch=batch, **pytorch_memory(name, batch),
                         **ubitrain_memory(name, batch, Path(tmp)))
                r.update(budget_points(name, batch, Path(tmp), r["pytorch_peak"]))
                r["arena_over_pytorch_peak"] = round(r["arena"] / r["pytorch_peak"], 3)
                r["floor_over_pytorch_peak"] = round(r["persistent"] / r["pytorch_peak"], 3)
                r["arena_over_lower_bound"] = round(r["arena"] / r["lower_bound"], 4)
                r["before_over_lower_bound"] = round(r["before_arena"] /
                                                     r["before_lower_bound"], 4)
                rows.append(r)
                print(f"{name:<19}{batch:>2} {r['pytorch_peak']:>13,} {r['pytorch_model']:>11,} "
                      f"{r['no_reuse']:>11,} {r['before_arena']:>11,} {r['arena']:>11,} "
                      f"{r['lower_bound']:>11,} {r['in_place_bytes']:>10,}  "
                      f"{r['arena_over_pytorch_peak']:>8.3f} {r['floor_over_pytorch_peak']:>6.3f} "
                      f"{r['no_reuse'] / r['arena']:>13.2f} "
                      f"{r['before_over_lower_bound']:>9.4f} {r['arena_over_lower_bound']:>8.4f}  "
                      + (f"{r['half_pt_arena']:,} ({r['half_pt_arena'] / r['pytorch_peak']:.3f} "
                         f"of PT), +{r['half_pt_overhead']:.1%}" if r["half_pt_arena"] else
                         f"infeasible (smallest {r['half_pt_smallest']:,})")
                      + f"; least {r['least_arena'] / r['pytorch_peak']:.3f} of PT, "
                        f"+{r['least_overhead']:.1%}", flush=True)
    print("bytes; PyTorch peak: torch.profiler memory timeline of one SGD-momentum step "
          "(input excluded); PT model: params+grads+momentum+buffers+saved activations; "
          "floor: persistent state / PyTorch peak, the least arena/PT of any plan")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
