"""Shared by every test module: the repository's root on sys.path, so that tests import the
development tools that do not ship in the package (tools/: the fuzzer, the real-model suite);
and the fixtures several modules use. What tests call (the referee's assertion, bit-for-bit
comparisons of builds, tool checks, data makers) is in harness.py."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def digits_factory() -> Path:
    """examples/digits_factory.py, the model factory the README's CLI examples compile."""
    return ROOT / "examples" / "digits_factory.py"


@pytest.fixture(scope="module")
def mlp_trainer(tmp_path_factory):
    """A host trainer of a small MLP (batch 4 of 3x2x2 inputs, 3 classes), per module: what
    the tests of wrong inputs, parameters and checkpoints poke at."""
    import torch
    from torch import nn

    import ubitrain as ub

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    return ub.compile(model, (x,), y, out_dir=tmp_path_factory.mktemp("t")).build()
