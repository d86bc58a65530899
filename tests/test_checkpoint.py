"""Crash-safe checkpoints (runtime_c/ub_checkpoint.c) and trainer.save / trainer.restore."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import require_tools
from torch import nn

import ubitrain as ub

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    exe = tmp_path_factory.mktemp("ck") / "checkpoint_crash"
    cmd = [shutil.which("gcc") or "cc", "-std=c99", "-O1", "-g", "-Wall", "-Werror", *SANITIZE,
           "-I", str(ROOT / "runtime_c"), str(ROOT / "tests/c/checkpoint_crash.c"),
           str(ROOT / "runtime_c/ub_checkpoint.c"), "-o", str(exe)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return exe


def test_every_cut_point_restores_old_or_new_whole(harness):
    run = subprocess.run([str(harness)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    cut_points = int(run.stdout.split("crash:")[1].split()[0])
    assert cut_points > 8000  # four saves of a 2 kB payload, cut at every byte


def test_fuzzed_blobs_never_crash_and_never_restore_garbage(harness):
    run = subprocess.run([str(harness), "fuzz", "100000"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fuzz: 100000 blobs" in run.stdout


@pytest.mark.parametrize("target", ["host", "aarch64-neon", "cortex-m4"])
def test_trainer_resumes_exactly_from_a_checkpoint(target, tmp_path):
    """On an emulated target the driver's storage requests come up the stream to the host's
    files (before: an emulated trainer had no save or restore)."""
    if target != "host":
        require_tools(target)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3),
                          nn.Linear(8, 3))
    batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(6)]
    pkg = ub.compile(model, batches[0][:1], batches[0][1], target=target,
                     optimizer=ub.Adam(lr=0.01, weight_decay=0.01), out_dir=tmp_path / "ck")
    straight, resumed = pkg.build(seed=3), pkg.build(seed=3)
    try:
        _resume(straight, resumed, batches, tmp_path)
    finally:
        for trainer in (straight, resumed):
            getattr(trainer, "close", lambda: None)()  # an emulated trainer's process


def _resume(straight, resumed, batches, tmp_path):
    for x, y in batches:
        straight.step(x, y)

    for x, y in batches[:3]:
        resumed.step(x, y)
    resumed.save(tmp_path / "new" / "state")
    with pytest.raises(ub.RuntimeStatusError, match="no complete checkpoint"):
        resumed.restore(tmp_path / "new" / "none")  # and nothing changes
    after_save = resumed.parameters()
    resumed.step(*batches[3])  # lost work: the restore goes back to the checkpoint
    resumed.restore(tmp_path / "new" / "state")
    assert resumed.steps == 3
    assert all(np.array_equal(after_save[k], v) for k, v in resumed.parameters().items())
    for x, y in batches[3:]:
        resumed.step(x, y)
    # Parameters, BN buffers, Adam moments, the step counter and the dropout RNG came back.
    for name, value in straight.parameters().items():
        assert np.array_equal(resumed.parameters()[name], value), name
    for name, value in straight.optimizer_state().items():
        assert np.array_equal(resumed.optimizer_state()[name], value), name


def test_restore_without_checkpoint_or_of_another_model_changes_nothing(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    small = ub.compile(nn.Linear(6, 3), (x,), y, out_dir=tmp_path / "a").build()
    other = ub.compile(nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 3)), (x,), y,
                       out_dir=tmp_path / "b").build()
    before = small.parameters()
    with pytest.raises(ub.RuntimeStatusError, match="no complete checkpoint"):
        small.restore(tmp_path / "nothing_here")
    other.save(tmp_path / "other")
    with pytest.raises(ub.RuntimeStatusError, match="another model"):
        small.restore(tmp_path / "other")
    assert all(np.array_equal(before[k], v) for k, v in small.parameters().items())
