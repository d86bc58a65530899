"""Shared by every test module: the repository's root on sys.path, so that tests import the
development tools that do not ship in the package (tools/: the fuzzer, the real-model suite)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
