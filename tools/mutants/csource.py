"""Reading a generated model.c: its kernel functions and the order the train step calls
them in."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DEFINITION = re.compile(r"^(?:UB_\w+ )*(?:static )?(?:inline )?int32_t (ub_\w+)\(", re.M)
_CALL = re.compile(r"UB_TRY\((ub_\w+)\(")


@dataclass(frozen=True)
class Function:
    name: str
    start: int  # offsets of its definition in the text, through its closing brace
    end: int


def functions(text: str) -> dict[str, Function]:
    """Every int32_t function defined in `text` (kernels, their static helpers)."""
    out = {}
    for m in _DEFINITION.finditer(text):
        end = text.find("\n}\n", m.end())
        if end >= 0:
            out[m.group(1)] = Function(m.group(1), m.start(), end + 2)
    return out


def train_calls(text: str) -> tuple[list[str], int]:
    """The kernels the train step calls, in order, and the index of the loss check (where
    the backward begins)."""
    fns = functions(text)
    step = next((f for name, f in fns.items() if name.endswith("_train_step")), None)
    if step is None:
        return [], 0
    calls = _CALL.findall(text, step.start, step.end)
    return calls, calls.index("ub_check_loss") if "ub_check_loss" in calls else len(calls)


def backward_kernels(text: str) -> list[str]:
    """The kernels the train step calls after its loss, each once, in call order."""
    calls, loss = train_calls(text)
    seen: list[str] = []
    for name in calls[loss + 1:]:
        if name not in seen:
            seen.append(name)
    return seen


def group(text: str, kernel: str) -> list[Function]:
    """A kernel and its static helpers (named after it: the AVX2 and plain lanes of a
    micro-kernel), last first, so that editing one keeps the others' offsets."""
    return sorted((f for name, f in functions(text).items() if name.startswith(kernel)),
                  key=lambda f: -f.start)


def edit_group(text: str, kernel: str, edit) -> tuple[str, int]:
    """`edit(body) -> (new body, changes)` on every function of `kernel`'s group."""
    total = 0
    for f in group(text, kernel):
        body, n = edit(text[f.start:f.end])
        text, total = text[:f.start] + body + text[f.end:], total + n
    return text, total


def edit_first(text: str, kernels, edit, what: str) -> tuple[str, str] | None:
    """`edit` on the first of `kernels` it changes anything in: (new text, where), or None."""
    for kernel in kernels:
        new, n = edit_group(text, kernel, edit)
        if n:
            return new, f"{what} in {kernel} ({n} places)"
    return None
