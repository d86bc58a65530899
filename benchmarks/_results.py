"""Where every benchmark writes its results: one JSON file (results/ is not versioned).

Every benchmark imports this module first, so it also puts the repository's root on sys.path:
the benchmarks that use the development tools (tools/: the real-model suite, the greedy
planner, the micro-kernel harness) import them from there, as the tests do
(tests/conftest.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_json(out, data, say: bool = True) -> None:
    """`data` as indented JSON in `out` (its folder made if missing), and say so (unless
    `say` is false: a long benchmark's results so far)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    if say:
        print(f"written to {out}")
