"""The fuzzer's fixed-seed tier: 100 random models, each trained through the generated C (every
pass on, and a random set off) and judged against PyTorch in float64 (ubitrain.fidelity).
`ubitrain fuzz --seeds A:B` runs any other range; a failure there becomes a named regression
test in test_fidelity_regressions.py."""

import pytest
import torch

from ubitrain.fidelity.fuzz import draw_case, run_case
from ubitrain.fidelity.reduce import repro_script

SEEDS = 100
GROUPS = 4  # classes, so that pytest-xdist (--dist loadscope) spreads them over its workers


def check(seed, tmp_path):
    torch.set_num_threads(1)
    case = draw_case(seed)
    outcome = run_case(case, tmp_path)
    assert not outcome.failed, (f"seed {seed}: {outcome.status}\n{outcome.detail}\n\n"
                                f"repro:\n{repro_script(case, outcome)}")
    assert outcome.status in ("match", "near kink", "diverges"), outcome.detail


def _group(k):
    seeds = range(k, SEEDS, GROUPS)

    class Group:
        @pytest.mark.parametrize("seed", seeds)
        def test_random_model_trains_like_pytorch(self, seed, tmp_path):
            check(seed, tmp_path)

    Group.__name__ = Group.__qualname__ = f"TestSeeds{k}"
    return Group


for _k in range(GROUPS):
    globals()[f"TestSeeds{_k}"] = _group(_k)
