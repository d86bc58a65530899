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
