"""The referee can fail: a small model built with deliberately wrong C (tools/mutants/), one
plausible defect at a time, is told apart from PyTorch, and the C as generated is not. The
whole suite over the real models: benchmarks/mutants.py."""

import torch
from torch import nn

import ubitrain as ub
from tools.mutants import BASELINE, judge_mutants, mutant


class Residual(nn.Module):
    """conv-BN-ReLU6, a depthwise residual block with BN and ReLU, max pooling, a linear head:
    a fan-out, both kink kinds, BatchNorm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU6(inplace=True))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                                   nn.ReLU(inplace=True), nn.Conv2d(8, 8, 1))
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.fc(self.pool(x).flatten(1))


def test_mutants_of_a_small_model_are_caught(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))]
    names = ["drop_sum_term", "kink_le", "no_weight_decay"]
    results = judge_mutants([BASELINE] + [mutant(n) for n in names], Residual(), data,
                            ub.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4), tmp_path)
    base, *mutants = results
    assert base.status == "match", base.summary
    for r in mutants:
        assert r.exercised, f"{r.mutant}: {r.where}"
        assert r.caught, f"{r.mutant} ({r.where}) not caught: {r.summary}"
