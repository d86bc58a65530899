"""The project's C prefix, `ub_<name>_`, kept clear of the names ubitrain's own C uses.

A generated model names its symbols `ub_<name>_<suffix>` and `UB_<NAME>_<SUFFIX>` (the
templates say which suffixes), its library `ub_<name>`; the runtime, the kernels and the
templates have `ub_...` names of their own (`ub_check_loss`, `ub_checkpoint_save`, the
`ub_f32_<op>` kernels, model.c's `ub_check_ctx`). A model named `check` or `checkpoint`
redeclared them and did not build. Both sets are read from the package's own C files,
templates and C-printing Python, so that a new name on either side is covered at once.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from ..kernels.library import DTYPE_TOKENS

PACKAGE = Path(__file__).resolve().parent.parent
C_FILES = (".c", ".h", ".j2", ".S", ".s", ".ld", ".cmake", ".txt")
# a name, not a file name ("ub_checkpoint.h" names no symbol)
IDENTIFIER = re.compile(r"\b(?:ub|UB)_[A-Za-z0-9_]+\b(?!\.[A-Za-z])")
QUOTED = re.compile(r"[\"'][^\"'\n]*?\b((?:ub|UB)_[A-Za-z0-9_]+)\b(?!\.[A-Za-z])")  # printed C
# the model's own: ub_{{ m }}_ctx, UB_{{ M }}_INPUT{{ i }}_ELEMENTS (a family: "input...")
MODEL_NAME = re.compile(r"\b(ub_|UB_)\{\{ ?[mM] ?\}\}([A-Za-z0-9_]*)(\{\{)?")


def _files():
    for folder, _, files in os.walk(PACKAGE, followlinks=True):  # runtime_c, target_files
        for file in files:
            path = Path(folder) / file
            if path.suffix in C_FILES or path.suffix == ".py":
                yield path, path.read_text(errors="replace")


@functools.cache
def _names() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(ubitrain's own names, the model's suffixes, the model's suffix families): C is case
    sensitive, so `ub_x` and `UB_X` are different names and kept as they are spelt. A bare
    `ub_{{ m }}` is the CMake target, which no C name can clash with."""
    own, suffixes, families = set(), set(), set()
    for path, text in _files():
        if path.suffix == ".py":
            own.update(QUOTED.findall(text))
            continue
        own.update(IDENTIFIER.findall(text))
        for head, suffix, more in MODEL_NAME.findall(text):
            if suffix:
                (families if more else suffixes).add(head + "\0" + suffix)
    return frozenset(own), frozenset(suffixes), frozenset(families)


def clash(name: str) -> str | None:
    """A name of ubitrain's own C that the model's `ub_<name>_...` or `UB_<NAME>_...` would
    declare again (or the kernels' namespace `ub_<dtype>_` it falls in), or None."""
    for token in DTYPE_TOKENS.values():
        if f"ub_{name}_".startswith(f"ub_{token}_"):
            return f"the kernels' ub_{token}_<op>"
    own, suffixes, families = _names()
    model = {s.replace("\0", name if s[0] == "u" else name.upper()) for s in suffixes}
    model_families = [s.replace("\0", name if s[0] == "u" else name.upper()) for s in families]
    return next((n for n in sorted(own)
                 if n in model or any(n.startswith(f) for f in model_families)), None)
