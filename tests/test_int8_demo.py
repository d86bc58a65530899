"""`ubitrain demo --precision int8`: the digits CNN trained in int8 (NITI) through the
generated C reaches the accuracy of the same network trained in fp32, within 3 points."""

import json
import subprocess
import sys

from ubitrain.cli import build_parser
from ubitrain.demos.int8 import run_int8_demo


def test_int8_demo_within_three_points_of_fp32(tmp_path):
    lines = []
    r = run_int8_demo(epochs=5, out_dir=tmp_path / "demo", progress=False, log=lines.append)
    assert r["fp32_accuracy"] >= 0.93
    assert r["int8_accuracy"] >= r["fp32_accuracy"] - 0.03, lines[-2]
    assert r["int8_adaptive_accuracy"] >= r["fp32_accuracy"] - 0.03, lines[-2]
    assert 0.3 < r["skipped_share"] < 1.0
    assert r["int8_arena_bytes"] < r["fp32_arena_bytes"] / 2
    assert any(line.startswith("test accuracy: fp32") for line in lines)


FACTORY = """
import torch
from ubitrain.zoo import DigitsCNNNiti
def factory(batch=8):
    torch.manual_seed(0)
    return DigitsCNNNiti(), (torch.randn(batch, 1, 8, 8),), torch.randint(0, 10, (batch,))
"""


def test_commands_take_precision(tmp_path):
    demo = build_parser().parse_args(["demo", "--precision", "int8"])
    assert demo.precision == "int8"
    (tmp_path / "net.py").write_text(FACTORY)
    out = subprocess.run([sys.executable, "-m", "ubitrain.cli", "compile",
                          f"{tmp_path / 'net.py'}:factory", "--precision", "int8",
                          "--adaptive-rescale", "--out-dir", str(tmp_path / "p"),
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "memory plan: arena" in out.stdout
    manifest = json.loads((tmp_path / "p" / "package.json").read_text())
    assert manifest["precision"] == "int8" and manifest["int8"]["niti"]["adaptive_rescale"]
    out = subprocess.run([sys.executable, "-m", "ubitrain.cli", "compile",
                          f"{tmp_path / 'net.py'}:factory", "--precision", "int8",
                          "--target", "hexagon-v66", "--dsp-offload", "--out-dir",
                          str(tmp_path / "dsp"), "--no-progress"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "placement of the int8 step" in out.stdout and "kernels on the DSP" in out.stdout
