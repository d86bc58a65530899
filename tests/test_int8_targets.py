"""precision="int8" on every cross target: the generated C, built by the target's real cross
compiler and run under QEMU (one emulator process per target), equals the numpy reference
bit for bit after a few steps with self-adaptive rescaling and a change of mu. A missing
toolchain skips locally and fails in CI (CI=true)."""

import pytest
import torch
from harness import CROSS, require_tools
from niti_harness import check_against_reference, niti_batches, niti_net

import ubitrain as ub

STEPS = 6


@pytest.mark.parametrize("target", CROSS)
def test_int8_step_on_target_equals_reference(tmp_path, target):
    require_tools(target)
    data = niti_batches(STEPS, seed=3)
    config = ub.NITI(mu=(5, 4), milestones=(3,), adaptive_rescale=True, max_interval=2)
    pkg = ub.compile(niti_net(), (torch.from_numpy(data[0][0]),), torch.from_numpy(data[0][1]),
                     precision="int8", optimizer=config, target=target, out_dir=tmp_path / "m")
    stats = check_against_reference(pkg, data, config)
    assert stats["skipped"] > 0
