"""What the memory plan promises, checked on the emitted C rather than the planner's bookkeeping.

* No two buffers alive at the same call overlap, and everything lies inside the arena that
  model.h declares: offsets are parsed from the `(A + <offset>u)` pointers of model.c.
* The arena is within 2% of the lower bound on every model of the zoo, and never above
  TFLite Micro's greedy-by-size placement of the same buffers.
* Gradients of the whole model never coexist (early optimizer update).
* In-place sharing happens on a model with ReLU and residual adds, and training through it
  gives bit-identical parameters.
"""

import random
import re

import pytest
import torch
from emitted_plan import check_emitted_plan
from harness import assert_same_training, train_build

import ubitrain as ub
from tools.greedy_planner import GreedyPlanner
from ubitrain.memory.arena_planner import ArenaPlanner
from ubitrain.zoo import ZOO


def _compile(name, batch, out_dir, optimizer=None, disable_passes=()):
    entry = ZOO[name]
    torch.manual_seed(0)
    x = torch.randn(batch, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (batch,))
    pkg = ub.compile(entry.factory(), (x,), y, optimizer=optimizer or ub.Adam(),
                     out_dir=out_dir, disable_passes=disable_passes)
    return pkg, x, y


def test_arena_planner_random_buffers_never_collide_and_beat_greedy():
    rng = random.Random(1)
    wins = 0
    for _ in range(60):
        planner, greedy = ArenaPlanner(alignment=16), GreedyPlanner(alignment=16)
        spans = []
        for _ in range(rng.randint(1, 40)):
            first = rng.randint(0, 40)
            spans.append((rng.randint(1, 5000), first, first + rng.randint(0, 12)))
        for s in spans:
            planner.add_buffer(*s)
            greedy.add_buffer(*s)
        placed = [(planner.offset(i), planner.sizes[i], s[1], s[2]) for i, s in enumerate(spans)]
        for i, a in enumerate(placed):
            assert a[0] % 16 == 0 and a[0] + a[1] <= planner.arena_size()
            for b in placed[i + 1:]:
                if a[2] <= b[3] and b[2] <= a[3]:
                    assert a[0] + a[1] <= b[0] or b[0] + b[1] <= a[0]
        assert greedy.lower_bound() == planner.lower_bound() <= planner.arena_size()
        assert planner.arena_size() <= greedy.arena_size()
        wins += planner.arena_size() < greedy.arena_size()
    assert wins > 0  # the search finds better placements than greedy by size


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("model_name", list(ZOO))
def test_zoo_plan_holds_in_the_emitted_c(model_name, batch, tmp_path):
    pkg, _, _ = _compile(model_name, batch, tmp_path / "m")
    plan = pkg.memory_plan
    arena = check_emitted_plan(pkg)
    assert arena == plan.arena_bytes
    assert plan.arena_bytes <= 1.02 * plan.lower_bound_bytes, plan.summary()
    # Never worse than TFLite Micro's greedy by size on the same buffers.
    greedy_peak = 0
    for prog in pkg.programs.values():
        greedy = GreedyPlanner(plan.alignment)
        for s, (a, b) in prog.lifetimes().items():
            greedy.add_buffer(s.nbytes, a, b)
        greedy_peak = max(greedy_peak, greedy.arena_size())
    assert plan.arena_bytes <= plan.persistent_bytes + greedy_peak
    # Early update: the gradients of all parameters are never alive at one moment. A
    # Linear weight updated in its gradient GEMM's epilogue has no gradient buffer at all.
    train = pkg.programs["train_step"]
    spans = train.lifetimes()
    updates = [c for c in train.calls if "param" in c.attrs]
    assert len(updates) == len(pkg.trainable)
    grads = [(c.args[1].root, spans[c.args[1].root]) for c in updates
             if "matmul_update" not in c.kernel]
    total = sum(g.nbytes for g, _ in grads)
    peak = max(sum(g.nbytes for g, (a, b) in grads if a <= t <= b) for t in range(len(train.calls)))
    assert peak < total or len(grads) <= 1
    names = {b.name for b in plan.buffers}
    assert all(b.decision == "keep" for b in plan.buffers) and len(names) == len(plan.buffers)


def test_in_place_sharing_keeps_training_bit_identical(tmp_path):
    pkg, x, y = _compile("resnet_small", 2, tmp_path / "inplace",
                         ub.SGD(lr=0.05, momentum=0.9))
    train = pkg.programs["train_step"]
    shared = [c.kernel for c in train.calls if re.search(r"_inplace\d*__", c.kernel)]
    assert any("_add" in k for k in shared) and any("_where" in k for k in shared), shared
    assert pkg.memory_plan.in_place_bytes["train_step"] > 0
    assert any(b.shared_by for b in pkg.memory_plan.buffers)
    # The in-place variant reads the overwritten input through the output's pointer only.
    source = (pkg.out_dir / "model.c").read_text()
    kernel = re.search(r"UB_KERNEL int32_t ub_f32_\w*where\w*_inplace\d*__scalar\(.*?\n}",
                       source, re.S)
    assert kernel, "no in-place where kernel"
    unused = re.search(r"\(void\)(\w+);  /\* read through (\w+) \*/", kernel.group(0))
    assert unused, kernel.group(0)
    body = kernel.group(0).split(unused.group(0), 1)[1]
    assert not re.search(rf"\b{unused.group(1)}\b", body) and f"{unused.group(2)}[" in body
    check_emitted_plan(pkg)

    plain, _, _ = _compile("resnet_small", 2, tmp_path / "plain", ub.SGD(lr=0.05, momentum=0.9),
                           disable_passes=("share_in_place",))
    assert not any("_inplace" in c.kernel for c in plain.programs["train_step"].calls)
    assert plain.memory_plan.in_place_bytes == {"train_step": 0, "predict": 0}

    assert_same_training(train_build(pkg, [(x, y)] * 3), train_build(plain, [(x, y)] * 3))


def test_report_command_draws_the_plan(tmp_path, capsys, digits_factory):
    from ubitrain.cli import main

    png = tmp_path / "plan.png"
    assert main(["report", f"{digits_factory}:factory", "--batch", "4", "--out-dir",
                 str(tmp_path / "m"), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = (tmp_path / "plan.txt").read_text()
    assert "lower bound" in text and "bytes by kind" in text and "keep" in text
    assert "picture written to" in capsys.readouterr().out
