"""Training under `memory_budget=`: recomputation and paging (memory/budget.py).

* The arena fits the budget, checked from the offsets printed in model.c (not from the
  planner's bookkeeping), and training under the budget gives bit-identical losses,
  parameters and optimizer state to the unconstrained build, with both recomputation and
  paging in the plan (and Dropout masks, drawn once per step, never replayed).
* The MILP's optimum equals an exhaustive search over every keep/page/recompute choice on
  a small instance, and its memory model never undercounts the rewritten program.
* A budget below what any plan reaches fails with the smallest budget that works, and that
  budget then compiles and fits.
* These tests pin micro_batches=1: keep / recompute / page alone give the same bits
  (micro-batching is tested in test_micro_batching.py).
* On a microcontroller target (built by its cross compiler, run under QEMU), the driver
  pages through semihosted files and trains bit-identically to its unconstrained build.
"""

import itertools
import random
import re

import pytest
import torch
from emitted_plan import check_emitted_plan
from harness import assert_same_training, require_tools, train_build
from torch import nn

import ubitrain as ub
from ubitrain.api import lower
from ubitrain.errors import RuntimeStatusError
from ubitrain.memory.arena_planner import ArenaPlanner
from ubitrain.memory.cost_model import KernelWork
from ubitrain.memory.remat_milp import BudgetProblem
from ubitrain.program.remat import find_candidates, recompute_choice, rewrite
from ubitrain.targets import get_target
from ubitrain.zoo import ZOO


def _zoo_batch(name, batch):
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    torch.manual_seed(1)
    return entry.factory(), x, y


def _updates_after_every_use(program):
    """The early optimizer update of a parameter comes after every read of it."""
    for i, call in enumerate(program.calls):
        if "param" in call.attrs:
            root = call.args[0].root
            assert not any(a.root is root for c in program.calls[i + 1:] for a in c.args), \
                call.attrs["param"]


def test_tight_budget_recomputes_and_pages_bit_identically(tmp_path):
    model, x, y = _zoo_batch("mobilenetv2_small", 2)
    opt = ub.SGD(lr=0.05, momentum=0.9)
    plain = ub.compile(model, (x,), y, optimizer=opt, out_dir=tmp_path / "plain")
    # Just above the smallest plan: it needs paging besides replays (a fixed share of the
    # arena would follow every planner improvement). A tenth of the way up: since BatchNorm
    # is one fused kernel, the plans closer to the smallest page only.
    smallest = _smallest_budget(model, x, y, opt, "host", tmp_path / "too_small")
    budget = smallest + (plain.memory_plan.arena_bytes - smallest) // 10
    pkg = ub.compile(model, (x,), y, optimizer=opt, memory_budget=budget, micro_batches=1,
                     out_dir=tmp_path / "budget")
    assert check_emitted_plan(pkg) == pkg.memory_plan.arena_bytes <= budget
    decisions = {b.decision for b in pkg.memory_plan.buffers}
    assert {"keep", "recompute", "page"} <= decisions
    train = pkg.programs["train_step"]
    kernels = [c.kernel for c in train.calls]
    assert "ub_page_out" in kernels and "ub_page_in" in kernels
    replays = [c for c in train.calls if "replay_of" in c.attrs]
    assert replays and not any(c.builtin for c in replays)
    _updates_after_every_use(train)
    report = pkg.memory_plan.budget
    assert report.arena_bytes <= budget and report.extra_seconds > 0
    assert "recompute" in report.summary() and "page" in report.summary()

    batches = [(x.numpy(), y.numpy())] * 3
    assert_same_training(train_build(pkg, batches), train_build(plain, batches))

    trainer = pkg.build()  # paging planned and no storage: a clear status, nothing run
    trainer.ctx.page_storage = None
    with pytest.raises(RuntimeStatusError, match="no page storage was set"):
        trainer.step(x.numpy(), y.numpy())


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
            nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(8 * 8 * 8, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def test_tightest_budget_with_dropout_and_batchnorm(tmp_path):
    """At the smallest budget it states, a model with Dropout masks (drawn once per step)
    and BatchNorm (running statistics copied back at the end) trains as without a budget."""
    torch.manual_seed(0)
    model, x, y = DropoutNet(), torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    opt = ub.Adam(lr=1e-2)
    with pytest.raises(ub.CompileError) as err:
        ub.compile(model, (x,), y, optimizer=opt, memory_budget="1KiB", micro_batches=1,
                   out_dir=tmp_path / "no")
    message = str(err.value)
    assert "batch 4" in message and "target 'host'" in message
    smallest = int(re.search(r"smallest budget that works is ([\d,]+) bytes",
                             message).group(1).replace(",", ""))
    pkg = ub.compile(model, (x,), y, optimizer=opt, memory_budget=smallest, micro_batches=1,
                     out_dir=tmp_path / "tight")
    plain = ub.compile(model, (x,), y, optimizer=opt, out_dir=tmp_path / "plain")
    assert check_emitted_plan(pkg) <= smallest < plain.memory_plan.arena_bytes
    train = pkg.programs["train_step"]
    masks = {c.args[0].root for c in train.calls if c.kernel == "ub_dropout_mask"}
    assert len(masks) == 2
    assert not any(w.root in masks for c in train.calls if "replay_of" in c.attrs
                   for w in c.writes)
    _updates_after_every_use(train)
    assert {b.decision for b in pkg.memory_plan.buffers} - {"keep"}
    batches = [(x.numpy(), y.numpy())] * 3
    assert_same_training(train_build(pkg, batches), train_build(plain, batches))


def _problem(name, batch, top):
    model, x, y = _zoo_batch(name, batch)
    unit = lower(model, (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9),
                 disable_passes=("microkernels",))
    train = unit.train
    cands = sorted(find_candidates(train, 64), key=lambda c: -c.nbytes)[:top]
    return train, cands, BudgetProblem(train, cands, KernelWork(unit.library),
                                       get_target("cortex-m4").cost, 16)


def test_milp_matches_exhaustive_search_and_never_undercounts_memory():
    train, cands, problem = _problem("digits_cnn", 4, 6)
    assert any(len(c.replays) > 1 for c in cands) and len(cands) == 6

    def options(c):
        return ["keep", "page"] + [recompute_choice(r.depth) for r in c.replays]

    def feasible(choice):
        return all(not how.startswith("recompute") or all(
            choice.get(d, "keep") == "keep" for d in c.replay_for(how).deps)
            for c, how in choice.items())

    def cost(choice):
        return sum(problem.cost_of(i, choice[c]) for i, c in enumerate(cands))

    plans = [dict(zip(cands, hows)) for hows in itertools.product(*map(options, cands))]
    plans = [p for p in plans if feasible(p)]
    unconstrained = problem.peak({})
    least = min(problem.peak(p) for p in plans)
    for frac in (0.95, 0.8, 0.6, 0.3):
        budget = least + frac * (unconstrained - least)
        best = min(cost(p) for p in plans if problem.peak(p) <= budget)
        solution = problem.solve(budget)
        assert solution.cost == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert problem.peak(solution.choices) <= budget
    assert problem.least_memory().peak == pytest.approx(least)

    rng = random.Random(0)
    for plan in rng.sample(plans, 40):  # the bytes really alive after the rewrite
        program, _ = rewrite(train, plan)
        planner = ArenaPlanner(16)
        for s, (a, b) in program.lifetimes().items():
            planner.add_buffer(s.nbytes, a, b)
        assert planner.lower_bound() <= problem.peak(plan)


def test_report_marks_recomputed_and_paged_buffers(tmp_path, capsys, digits_factory):
    from ubitrain.cli import main

    args = ["report", f"{digits_factory}:factory", "--batch", "4", "--out-dir", str(tmp_path / "m")]
    assert main(args + ["--png", str(tmp_path / "plain.png")]) == 0
    arena = int(re.search(r"arena ([\d,]+) B", capsys.readouterr().out).group(1)
                .replace(",", ""))
    png = tmp_path / "plan.png"
    assert main(args + ["--png", str(png), "--memory-budget", str(arena * 3 // 4)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "plan.txt").read_text()
    assert "memory budget" in text
    assert re.search(r"^(recompute|page): \d+ buffers", text, re.M), text


def _smallest_budget(model, x, y, opt, target, out_dir):
    with pytest.raises(ub.CompileError) as err:
        ub.compile(model, (x,), y, optimizer=opt, target=target, memory_budget=1,
                   micro_batches=1, out_dir=out_dir)
    found = re.search(r"smallest budget that works is ([\d,]+) bytes", str(err.value))
    return int(found.group(1).replace(",", ""))


def test_paging_on_a_microcontroller_under_qemu(tmp_path):
    target = "cortex-m4"
    require_tools(target)
    model, x, y = _zoo_batch("digits_cnn", 4)
    opt = ub.SGD(lr=0.05, momentum=0.9)
    smallest = _smallest_budget(model, x, y, opt, target, tmp_path / "no")
    pkg = ub.compile(model, (x,), y, optimizer=opt, target=target, memory_budget=smallest,
                     micro_batches=1, out_dir=tmp_path / "budget")
    assert check_emitted_plan(pkg) <= smallest
    assert any(c.kernel == "ub_page_out" for c in pkg.programs["train_step"].calls)
    plain = ub.compile(model, (x,), y, optimizer=opt, target=target, out_dir=tmp_path / "plain")
    batches = [(x.numpy(), y.numpy())] * 3
    assert_same_training(train_build(pkg, batches), train_build(plain, batches))
