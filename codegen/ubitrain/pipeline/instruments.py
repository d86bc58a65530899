"""Instruments: what watches a compile without changing how it is made (TVM's pass
instruments play the same part). `ub.compile(..., instruments=[...])` runs each instrument's
`after(step, unit)` after every step that ran."""

from __future__ import annotations


class Instrument:
    """`trace_calls`: the generated step calls the function pointer ub_<model>_trace, when
    set, with the program (0 train_step, 1 predict), the call's index and the arena, after
    every call (project/emit.py)."""

    trace_calls = False

    def after(self, step, unit) -> None:
        """Called after each step of the pipeline that ran."""


class CallTrace(Instrument):
    """A trace hook after every call of the generated step, and the kernel library the
    project was written from: what fidelity/trace.py needs to run each call's PrimFunc beside
    the C, and the referee's replay (fidelity/sides.py) to read the C's forward tensors."""

    trace_calls = True

    def __init__(self):
        self.library = None  # kernels/library.py KernelLibrary of the written project

    def after(self, step, unit) -> None:
        if step.name == "write_project":
            self.library = unit.library
