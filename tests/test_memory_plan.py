"""The arena planner: no two buffers alive at once share a byte, and the arena is sized right."""

import random

import pytest
import torch

import ubitrain as ub
from tools.greedy_planner import GreedyPlanner
from ubitrain.zoo import ZOO


def overlaps(a, b):
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def test_greedy_planner_random_buffers_never_collide():
    rng = random.Random(0)
    for _ in range(50):
        planner = GreedyPlanner(alignment=16)
        spans = []
        for _ in range(rng.randint(1, 30)):
            first = rng.randint(0, 40)
            spans.append((rng.randint(1, 5000), first, first + rng.randint(0, 10)))
        ids = [planner.add_buffer(*s) for s in spans]
        placed = [(planner.offset(i), planner.buffers[i].size, s[1], s[2])
                  for i, s in zip(ids, spans)]
        for i, a in enumerate(placed):
            assert a[0] % 16 == 0 and a[0] + a[1] <= planner.arena_size()
            for b in placed[i + 1:]:
                if a[2] <= b[3] and b[2] <= a[3]:  # lifetimes intersect
                    assert not overlaps(a, b)
        assert planner.arena_size() >= planner.lower_bound()


def test_greedy_planner_reuses_dead_memory():
    planner = GreedyPlanner(alignment=1)
    planner.add_buffer(100, 0, 1)
    planner.add_buffer(100, 2, 3)  # starts after the first one died: same bytes
    planner.add_buffer(50, 1, 2)
    assert planner.arena_size() == 150 == planner.lower_bound()


@pytest.mark.parametrize("model_name", ["lenet5", "resnet_small"])
def test_compiled_plan_is_consistent(model_name, tmp_path):
    entry = ZOO[model_name]
    torch.manual_seed(0)
    x = torch.randn(2, *entry.sample_shape)
    y = torch.randint(0, entry.classes, (2,))
    pkg = ub.compile(entry.factory(), (x,), y, optimizer=ub.Adam(), out_dir=tmp_path / "m")
    plan = pkg.memory_plan
    assert plan.lower_bound_bytes <= plan.arena_bytes
    kinds = plan.bytes_by_kind()
    for kind in ("parameter", "optimizer_state", "activation", "gradient"):
        assert kinds.get(kind, 0) > 0, kind
    has_batchnorm = any(isinstance(m, torch.nn.BatchNorm2d) for m in entry.factory().modules())
    assert (kinds.get("buffer", 0) > 0) == has_batchnorm
    params = sum(p.numel() * 4 for p in entry.factory().parameters())
    assert kinds["parameter"] == params and kinds["optimizer_state"] == 2 * params
    for b in plan.buffers:
        assert b.offset % plan.alignment == 0 and b.offset + b.nbytes <= plan.arena_bytes
    persistent = [b for b in plan.buffers if b.lifetime is None]
    for prog in ("train_step", "predict"):
        live = [b for b in plan.buffers if b.program == prog] + persistent
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                alive_together = (a.lifetime is None or b.lifetime is None or
                                  (a.lifetime[0] <= b.lifetime[1] and
                                   b.lifetime[0] <= a.lifetime[1]))
                if alive_together:
                    assert not overlaps((a.offset, a.nbytes), (b.offset, b.nbytes)), (a, b)
