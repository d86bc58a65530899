"""The command line: one-line errors, no torch chatter on stderr, a start-up without torch
or tvm, a project built for another target than it was compiled for."""

import pytest
from harness import run_cli


@pytest.mark.parametrize("args,match", [
    (("compile",), "the following arguments are required: MODEL"),
    (("compile", "m.py:f", "--lr", "fast"), "argument --lr: invalid float value: 'fast'"),
    # the fuzzer is a development tool of the checkout now (test_fuzz.py checks its errors)
    (("fuzz", "--seeds", "x"), "argument COMMAND: invalid choice: 'fuzz'"),
    (("compile", "m.py:f", "--input-shape", "1,8,x"), "--input-shape '1,8,x' is not a shape"),
])
def test_cli_errors_are_one_line(args, match, tmp_path):
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(64, 3))\n")
    run = run_cli(*args, cwd=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], run.stderr


def test_cli_keeps_torch_chatter_off_stderr(tmp_path):
    """A model that makes PyTorch warn (padding='same' with an even kernel): the CLI prints
    only its own lines; --verbose shows the rest."""
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Conv2d(1, 2, 2, "
                                   "padding='same'), nn.Flatten(), nn.Linear(128, 3))\n")
    run = run_cli("compile", "m.py:f", "--input-shape", "1,8,8", "--batch", "2",
                  "--no-progress", "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "", run.stderr


def test_the_cli_starts_without_torch_or_tvm():
    """`ubitrain --help` (and each command's --help) in a fresh interpreter imports neither
    torch, TVM nor numpy: before the fix `import ubitrain` took seconds to load them."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "from ubitrain.cli import COMMANDS, main\n"
            "for argv in [['--help']] + [[c, '--help'] for c in COMMANDS]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            main(argv)\n"
            "        except SystemExit as e:\n"
            "            assert e.code == 0, argv\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'tvm', 'numpy'}))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_building_a_project_for_another_target_than_it_was_compiled_for(tmp_path):
    """`ubitrain build --target hexagon-v66` of a host project: one line naming both targets
    and the two ways out (before: the toolchain file it lacked, or a host build of a
    cross project)."""
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(12, 3))\n")
    out = tmp_path / "net"
    assert run_cli("compile", "m.py:f", "--input-shape", "3,2,2", "--batch", "2",
                   "--no-progress", "--out-dir", str(out), cwd=tmp_path).returncode == 0
    run = run_cli("build", str(out), "--target", "hexagon-v66", "--no-progress", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: {out} was compiled for host, not hexagon-v66 (its "
                                  "kernels and memory plan are host's): build it with --target "
                                  "host, or compile the model again with --target hexagon-v66")
    assert not (out / "build-hexagon-v66").exists()
