"""The demo, the `ubitrain` command and the generated project built without Python."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACTORY = ROOT / "examples" / "digits_factory.py"
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None,
                                 reason="cmake and a C compiler build the generated project")


def ubitrain(*args, cwd=None, timeout=300):
    """Run the `ubitrain` command (its module, with this interpreter)."""
    return subprocess.run([sys.executable, "-m", "ubitrain.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_console_script_is_declared():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("ubitrain") == "ubitrain.cli:main"


@needs_cmake
def test_demo_reaches_90_percent_and_matches_pytorch(tmp_path):
    from ubitrain.demos.digits import run_demo

    lines = []
    result = run_demo(epochs=3, out_dir=tmp_path / "demo", progress=False, log=lines.append)
    c, ref = result["c_accuracy"], result["torch_accuracy"]
    assert c >= 0.90, f"the generated C reached only {100 * c:.2f}% test accuracy"
    assert abs(c - ref) <= 0.02, f"C {100 * c:.2f}% vs PyTorch {100 * ref:.2f}%"
    assert len(result["c_epochs"]) == len(result["torch_epochs"]) == 3
    # Same weights, same batches: the first epoch's mean losses agree closely.
    assert math.isclose(result["c_epochs"][0]["loss"], result["torch_epochs"][0]["loss"],
                        rel_tol=1e-3)
    assert result["arena_bytes"] >= result["lower_bound_bytes"] > 0
    assert result["memory_plan"].startswith("arena ")
    summary = [line for line in lines if line.startswith("test accuracy:")]
    assert summary and "PyTorch" in summary[0] and "compile" in summary[0] \
        and "arena" in summary[0]


@needs_cmake
def test_demo_command_prints_epochs_and_summary(tmp_path):
    run = ubitrain("demo", "--epochs", "1", "--out-dir", tmp_path / "demo", "--no-progress")
    assert run.returncode == 0, run.stderr
    assert re.search(r"\[generated C\] epoch 1/1 +loss [0-9.]+ +test accuracy [0-9.]+%",
                     run.stdout)
    assert re.search(r"\[PyTorch\] +epoch 1/1", run.stdout)
    m = re.search(r"test accuracy: generated C ([0-9.]+)%, PyTorch ([0-9.]+)% \| compile "
                  r"[0-9.]+ s \| memory plan: arena [0-9,]+ B", run.stdout)
    assert m, run.stdout
    assert "Traceback" not in run.stderr


MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include "model.h"

static float arena[UB_DIGITS_ARENA_BYTES / sizeof(float) + 1];
static float x[UB_DIGITS_INPUT0_ELEMENTS], out[UB_DIGITS_OUTPUT_ELEMENTS];
static int32_t y[UB_DIGITS_LABEL_ELEMENTS];

int main(void) {
    ub_digits_ctx ctx;
    float loss = 0.0f, first = 0.0f;
    for (int i = 0; i < UB_DIGITS_INPUT0_ELEMENTS; ++i) x[i] = (float)((i * 7) % 17) / 17.0f;
    for (int i = 0; i < UB_DIGITS_LABEL_ELEMENTS; ++i) y[i] = i % 10;
    if (ub_digits_init(&ctx, arena, sizeof(arena), 1) != UB_OK) return 1;
    for (int s = 0; s < 20; ++s) {
        if (ub_digits_train_step(&ctx, x, y, &loss) != UB_OK) return 2;
        if (s == 0) first = loss;
    }
    if (ub_digits_predict(&ctx, x, out) != UB_OK) return 3;
    y[0] = 10;  /* out of range: the step refuses it */
    if (ub_digits_train_step(&ctx, x, y, &loss) != UB_ERR_LABEL_RANGE) return 4;
    printf("first %f last %f\n", first, loss);
    return (isfinite(loss) && loss < first) ? 0 : 5;
}
"""


@needs_cmake
def test_compile_writes_a_project_that_builds_with_plain_cmake(tmp_path):
    out = tmp_path / "digits"
    run = ubitrain("compile", f"{FACTORY}:factory", "--out-dir", out, "--lr", "0.05",
                   "--momentum", "0.9")
    assert run.returncode == 0, run.stderr
    assert "memory plan: arena" in run.stdout and str(out) in run.stdout
    for name in ("model.h", "model.c", "CMakeLists.txt", "runtime_c/ub_runtime.c"):
        assert (out / name).is_file(), name

    # The user's build: CMake and the C compiler only, no Python anywhere.
    build = tmp_path / "b"
    for cmd in (["cmake", "-S", out, "-B", build], ["cmake", "--build", build]):
        step = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert step.returncode == 0, step.stdout + step.stderr
    library = build / "libub_digits.a"
    assert library.is_file()

    # A C program trains with it: 20 steps lower the loss on a fixed batch.
    (tmp_path / "main.c").write_text(MAIN_C)
    prog = tmp_path / "train"
    cc = subprocess.run(["cc", "-std=c99", "-O2", "-o", str(prog), str(tmp_path / "main.c"),
                         f"-I{out}", f"-I{out / 'runtime_c'}", str(library), "-lm"],
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    ran = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr

    # The repository's top-level CMakeLists.txt builds the runtime and this project too.
    top = tmp_path / "top"
    for cmd in (["cmake", "-S", ROOT, "-B", top, f"-DUB_MODEL_DIR={out}"],
                ["cmake", "--build", top]):
        step = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert step.returncode == 0, step.stdout + step.stderr
    assert (top / "model" / "libub_digits.a").is_file()

    # `ubitrain build` does the same for the host, and names what it built.
    run = ubitrain("build", out)
    assert run.returncode == 0, run.stderr
    assert (out / "build-host" / "libub_digits.so").is_file()
    assert "libub_digits.so" in run.stdout


def test_build_without_a_project_is_a_one_line_error(tmp_path):
    run = ubitrain("build", tmp_path)
    assert run.returncode == 2
    assert run.stderr.startswith("error:") and "no generated project" in run.stderr


def test_targets_lists_host():
    run = ubitrain("targets")
    assert run.returncode == 0, run.stderr
    assert re.search(r"^host\b", run.stdout, re.MULTILINE)


ERRORS = [
    (["compile", "no/such/model.py:factory"], "does not exist"),
    (["compile", f"{FACTORY}:no_such_factory"], "defines no 'no_such_factory'"),
    (["compile", str(FACTORY)], "path/to/file.py:factory"),
    (["compile", f"{FACTORY}:factory", "--target", "pdp-11"], "unknown target 'pdp-11'"),
    (["compile", f"{FACTORY}:factory", "--optimizer", "rmsprop"], "unknown optimizer"),
    (["compile", f"{FACTORY}:factory", "--input-shape", "1,8,8"], "--input-shape applies"),
    (["compile", f"{FACTORY}:factory", "--batch", "4", "--micro-batches", "3"],
     "micro_batches=3 does not divide the batch of 4; use one of [1, 2, 4]"),
    (["demo", "--epochs", "0"], "at least one epoch"),
    (["compile", f"{FACTORY}:factory", "--clip-grad-norm", "0"],
     "clip_grad_norm=0.0 must be a finite number > 0"),
    (["compile", f"{FACTORY}:factory", "--precision", "int8", "--clip-grad-norm", "1"],
     "--clip-grad-norm applies to --precision fp32 only"),
]


def test_compile_clips_gradients_on_request(tmp_path, capsys):
    from ubitrain.cli import main

    out = tmp_path / "clipped"
    assert main(["compile", f"{FACTORY}:factory", "--optimizer", "adamw", "--clip-grad-norm",
                 "0.5", "--out-dir", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    model_c = (out / "model.c").read_text()
    assert "double ub_clip = 0.5 / (sqrt(ub_sq) + 1e-6);" in model_c


@pytest.mark.parametrize("args, message", ERRORS)
def test_errors_are_one_line_with_status_2(tmp_path, capsys, args, message):
    from ubitrain.cli import main

    assert main([*args, "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]


@pytest.mark.parametrize("args", [["compile", "no/such/model.py:factory"],
                                  ["compile", f"{FACTORY}:factory", "--target", "pdp-11"]])
def test_command_exits_2_without_traceback(tmp_path, args):
    run = ubitrain(*args, "--out-dir", tmp_path / "out", timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("error: ") and "Traceback" not in run.stderr


@pytest.mark.parametrize("command", [[], ["compile"], ["demo"], ["targets"]])
def test_help_has_examples(command):
    from ubitrain.cli import build_parser

    parser = build_parser()
    if command:
        sub = next(a for a in parser._actions if a.dest == "command")
        parser = sub.choices[command[0]]
    text = parser.format_help()
    assert "examples:" in text and "ubitrain " in text


@needs_cmake
def test_compile_and_build_show_progress_on_request(tmp_path, capsys):
    """Bars name each step when asked for; off a terminal nothing is printed by default."""
    import torch

    import ubitrain as ub
    from ubitrain.api import COMPILE_STEPS

    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    pkg = ub.compile(model, (x,), y, out_dir=tmp_path / "shown", progress=True)
    pkg.build(progress=True)
    shown = capsys.readouterr().err
    for step in COMPILE_STEPS + ["cmake configure", "compile C"]:
        assert step in shown, step
    pkg = ub.compile(model, (x,), y, out_dir=tmp_path / "quiet")
    pkg.build()
    assert capsys.readouterr().err == ""


def test_batchnorm_micro_batching_warning_is_one_line(tmp_path, capsys):
    from ubitrain.cli import main

    assert main(["compile", f"{FACTORY}:factory", "--batch", "4", "--micro-batches", "2",
                 "--no-progress", "--out-dir", str(tmp_path / "out")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "micro-batch" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: micro-batching: ")
