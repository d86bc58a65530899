"""The compile pipeline: one declared sequence of steps per precision.

    fp32.py         the float32 pipeline, its steps listed in order at the top
    int8.py         the int8 (NITI) pipeline: the float one's, made integer after tracing
    steps.py        Step, Rewrite (a step that can be switched off, with its precondition
                    and its bit-exactness claim) and Pipeline
    unit.py         the request and the unit of compilation the steps transform
    request.py      ub.compile's arguments checked before any work
    instruments.py  what watches a compile (the call trace of fidelity/)
"""

from __future__ import annotations

from ..errors import CompileError
from .fp32 import FP32
from .instruments import CallTrace, Instrument
from .int8 import INT8
from .steps import Pipeline, Rewrite, Step, run_steps

PIPELINES = {p.precision: p for p in (FP32, INT8)}


def pipeline_for(precision: str, target: str = "host") -> Pipeline:
    if precision not in PIPELINES:
        raise CompileError(f"precision {precision!r} is not available for target {target!r}; "
                           f"available: {', '.join(PIPELINES)}")
    return PIPELINES[precision]


__all__ = ["PIPELINES", "FP32", "INT8", "CallTrace", "Instrument", "Pipeline",
           "Rewrite", "Step", "pipeline_for", "run_steps"]
