"""The compile pipeline: one declared sequence of steps per precision.

    fp32.py         the float32 pipeline, its steps listed in order at the top
    int8.py         the int8 (NITI) pipeline: the float one's, made integer after tracing
    int8_chain.py   the older chain-only int8 pipeline, left for a NITI(dsp_cache_bytes=...)
                    of one's own until the int8 one chunks the DSP's weight gradients
    steps.py        Step, Rewrite (a step that can be switched off, with its precondition
                    and its bit-exactness claim) and Pipeline
    unit.py         the request and the unit of compilation the steps transform
    request.py      ub.compile's arguments checked before any work
    instruments.py  what watches a compile (the call trace of fidelity/)
"""

from __future__ import annotations

from ..errors import CompileError
from ..int8.update import DSP_CACHE_BYTES
from .fp32 import FP32
from .instruments import CallTrace, Instrument
from .int8 import INT8
from .int8_chain import INT8_CHAIN
from .steps import Pipeline, Rewrite, Step, run_steps

PIPELINES = {p.precision: p for p in (FP32, INT8)}


def pipeline_for(precision: str, target: str = "host", optimizer=None) -> Pipeline:
    if precision not in PIPELINES:
        raise CompileError(f"precision {precision!r} is not available for target {target!r}; "
                           f"available: {', '.join(PIPELINES)}")
    if precision == "int8" and getattr(optimizer, "dsp_cache_bytes",
                                       DSP_CACHE_BYTES) != DSP_CACHE_BYTES:
        return INT8_CHAIN
    return PIPELINES[precision]


__all__ = ["PIPELINES", "FP32", "INT8", "INT8_CHAIN", "CallTrace", "Instrument", "Pipeline",
           "Rewrite", "Step", "pipeline_for", "run_steps"]
