"""The step program: ubitrain's own small IR between Relax and C.

A program is an ordered list of calls over tensor slots. A call runs either a printed TIR
kernel or a runtime builtin (copy, dropout mask, loss check, optimizer coefficients). Every
slot knows its size, dtype and kind; lifetimes come from the order of the calls. Memory
planning, placement and code emission read this IR and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Kinds that live across steps at fixed arena offsets.
PERSISTENT_KINDS = ("parameter", "buffer", "optimizer_state", "coefficients")
# Kinds the caller passes in by pointer; never in the arena.
EXTERNAL_KINDS = ("input", "label", "output")
# Kinds planned per program over their lifetimes ("accumulator": a gradient summed over
# micro-batches, program/micro_batch.py).
TRANSIENT_KINDS = ("activation", "gradient", "mask", "scratch", "accumulator")
LOOP_END = "ub_micro_batch_end"  # the last call of a micro-batch loop (program/micro_batch.py)


def dtype_bytes(dtype: str) -> int:
    return 1 if dtype == "bool" else np.dtype(dtype).itemsize


@dataclass(eq=False)
class Slot:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # one of the *_KINDS above, or "constant"
    value: np.ndarray | None = None  # initial value (state) or the value (constant)
    view_of: Slot | None = None  # a reshape shares its source's storage
    offset: int = 0  # bytes into view_of's storage (a part of a weight trained by channels)
    label: str | None = None  # the user-facing name (state_dict name) of a state slot
    in_place: bool = False  # a view because a kernel writes it over its dying input
    index_bound: int | None = None  # a model input of embedding ids: each lies in [0, bound)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_bytes(self.dtype)

    @property
    def root(self) -> Slot:
        return self.view_of.root if self.view_of is not None else self

    @property
    def root_offset(self) -> int:
        """Where this slot starts in its root's storage, in bytes."""
        return self.offset + (self.view_of.root_offset if self.view_of is not None else 0)

    @property
    def persistent(self) -> bool:
        return self.root.kind in PERSISTENT_KINDS

    @property
    def external(self) -> bool:
        return self.root.kind in EXTERNAL_KINDS

    def __repr__(self):
        return f"Slot({self.name}, {self.shape}, {self.dtype}, {self.kind})"


@dataclass(eq=False)
class Call:
    """`kernel(scratch, *args)`; `outputs` are the indices into `args` that are written."""

    kernel: str
    args: list[Slot]
    outputs: list[int]
    builtin: bool = False
    attrs: dict = field(default_factory=dict)
    scratch: Slot | None = None

    @property
    def reads(self) -> list[Slot]:
        return [a for i, a in enumerate(self.args) if i not in self.outputs]

    @property
    def writes(self) -> list[Slot]:
        return [self.args[i] for i in self.outputs]


def users(calls: list[Call], slot: Slot) -> list[int]:
    """Indices of the calls that pass `slot`'s storage (its root) as an argument."""
    root = slot.root
    return list(dict.fromkeys(  # a call passing it twice counts once
        i for i, c in enumerate(calls) for a in c.args
        if a is root or (a.view_of is not None and a.root is root)))


def merge_feeders(calls: list[Call], merge) -> list[Call]:
    """`calls` where merge(i) returns (at, call): call i becomes `call`, which does the work
    of call `at` (an earlier call that fed it) too, and call `at` is dropped."""
    out, dropped = list(calls), set()
    for i in range(len(calls)):
        merged = merge(i)
        if merged is not None:
            dropped.add(merged[0])
            out[i] = merged[1]
    return [c for j, c in enumerate(out) if j not in dropped]


@dataclass
class Program:
    name: str  # "train_step" or "predict"
    calls: list[Call]
    in_place_bytes: int = 0  # bytes of outputs that share an input's buffer (inplace.py)
    # slots that need their bytes though no call may use them (state of an unused layer)
    held: list[Slot] = field(default_factory=list)

    def slots(self) -> list[Slot]:
        seen, order = set(), []
        used = [s for call in self.calls
                for s in call.args + ([call.scratch] if call.scratch else [])]
        for s in used + self.held:
            for x in (s, s.root):
                if id(x) not in seen:
                    seen.add(id(x))
                    order.append(x)
        return order

    def lifetimes(self) -> dict[Slot, tuple[int, int]]:
        """[first, last] call index of every transient root slot. An accumulator carries its
        value from one micro-batch to the next, so it lives at least to the loop's end, even
        when no call after the loop reads it (int8's gradient exponents)."""
        spans: dict[Slot, list[int]] = {}
        loop_end = None
        for i, call in enumerate(self.calls):
            loop_end = i if call.kernel == LOOP_END else loop_end
            used = call.args + ([call.scratch] if call.scratch else [])
            for s in used:
                r = s.root
                if r.kind in TRANSIENT_KINDS:
                    span = spans.setdefault(r, [i, i])
                    span[1] = i
        for s, span in spans.items():
            if s.kind == "accumulator" and loop_end is not None:
                span[1] = max(span[1], loop_end)
        return {s: (a, b) for s, (a, b) in spans.items()}
