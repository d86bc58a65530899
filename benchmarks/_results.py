"""Where every benchmark writes its results: one JSON file (results/ is not versioned)."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(out, data) -> None:
    """`data` as indented JSON in `out` (its folder made if missing), and say so."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"written to {out}")
