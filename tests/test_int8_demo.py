"""`ubitrain demo --precision int8`: the digits CNN trained in int8 (NITI) through the
generated C reaches the accuracy of the same network trained in fp32, within 3 points."""

import subprocess
import sys

from ubitrain.demo_int8 import run_int8_demo


def test_int8_demo_within_three_points_of_fp32(tmp_path):
    lines = []
    r = run_int8_demo(epochs=5, out_dir=tmp_path / "demo", progress=False, log=lines.append)
    assert r["fp32_accuracy"] >= 0.93
    assert r["int8_accuracy"] >= r["fp32_accuracy"] - 0.03, lines[-2]
    assert r["int8_adaptive_accuracy"] >= r["fp32_accuracy"] - 0.03, lines[-2]
    assert 0.3 < r["skipped_share"] < 1.0
    assert r["int8_arena_bytes"] < r["fp32_arena_bytes"] / 2
    assert any(line.startswith("test accuracy: fp32") for line in lines)


def test_demo_command_takes_precision():
    out = subprocess.run([sys.executable, "-m", "ubitrain.cli", "demo", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--precision {fp32,int8}" in out.stdout
