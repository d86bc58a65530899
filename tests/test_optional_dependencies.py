"""The extras stay optional: `import ubitrain` and compiling a PyTorch model (with `ub.compile`
and with `ubitrain compile`) import none of onnx, onnxscript, matplotlib, torchvision,
transformers, peft or flwr, nor the repository's development tools (tools/); without onnx, an
ONNX model fails with the extra to install, and without matplotlib `ubitrain report` says
the same before compiling.
Each test runs in a fresh interpreter, where nothing else has imported those modules."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FACTORY = f"{ROOT / 'examples' / 'digits_factory.py'}:factory"
OPTIONAL = ("onnx", "onnxscript", "matplotlib", "torchvision", "transformers", "peft", "flwr",
            "tools")

# tools/ importable, as from a checkout, so that an import of it would succeed and show
PRELUDE = f"""\
import json, sys
sys.path.append({str(ROOT)!r})
def imported():
    return sorted({{m.split(".")[0] for m in sys.modules}} & set({OPTIONAL!r}))
"""


def _python(code: str, cwd: Path) -> tuple[dict, str]:
    """What the code prints last (JSON), and its stderr."""
    run = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True,
                         text=True, cwd=cwd, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def test_import_and_compile_import_no_extra(tmp_path):
    seen, stderr = _python(f"""
import torch
from torch import nn
import ubitrain as ub
from ubitrain.cli import main
seen = dict(after_import=imported())
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
x, y = torch.randn(2, 1, 6, 6), torch.tensor([0, 2])
ub.compile(model, (x,), y, optimizer=ub.Adam(lr=1e-3), out_dir={str(tmp_path / "api")!r})
seen.update(after_compile=imported())
seen.update(status=main(["compile", {FACTORY!r}, "--out-dir", {str(tmp_path / "cli")!r}]),
            after_cli_compile=imported())
print(json.dumps(seen))
""", tmp_path)
    assert seen == dict(after_import=[], after_compile=[], status=0, after_cli_compile=[]), \
        (seen, stderr[-3000:])
    assert (tmp_path / "api" / "CMakeLists.txt").exists()
    assert (tmp_path / "cli" / "CMakeLists.txt").exists()


def test_without_an_extra_the_error_names_it(tmp_path):
    """`sys.modules[name] = None` makes `import name` fail as if it were not installed."""
    onnx_file, out = str(tmp_path / "model.onnx"), str(tmp_path / "out")
    seen, stderr = _python(f"""
sys.modules["onnx"] = sys.modules["matplotlib"] = None
import torch
import ubitrain as ub
from ubitrain.cli import main
seen = {{}}
try:
    ub.compile({onnx_file!r}, (torch.zeros(1, 4),), torch.zeros(1, dtype=torch.long))
except ub.CompileError as err:
    seen["api"] = str(err)
seen["cli onnx"] = main(["compile", {onnx_file!r}, "--out-dir", {out!r}])
seen["cli report"] = main(["report", {FACTORY!r}, "--out-dir", {out!r}])
print(json.dumps(seen))
""", tmp_path)
    onnx = "ONNX models need the onnx extra: pip install 'ubitrain[onnx]'"
    report = "drawing the memory plan needs the report extra: pip install 'ubitrain[report]'"
    assert seen == {"api": onnx, "cli onnx": 2, "cli report": 2}, seen
    assert stderr.strip().splitlines() == [f"error: {onnx}", f"error: {report}"], stderr
    assert not (tmp_path / "out").exists()  # the report refused before compiling
