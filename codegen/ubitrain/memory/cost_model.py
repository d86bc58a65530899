"""What recomputing or paging a tensor costs on a target: the budget solver's objective.

The cost of a plan is POET's: Σ compute of the calls run again + Σ page-out + Σ page-in, in
seconds on the target. Compute is counted in loop iterations of a kernel's lowered TIR (the
innermost statement of every loop nest, each of which does one multiply-add or one
elementwise operation); a profile turns iterations and bytes into seconds:

    compute(call)  = iterations × seconds_per_iteration + call_seconds
    page_out(n B)  = latency + n / write_bytes_per_second
    page_in(n B)   = latency + n / read_bytes_per_second

`call_seconds` is the fixed price of a kernel call whatever its size (call and return,
argument checks, loop prologues, the first touch of its operands): it is what makes k
micro-batches of B/k samples cost more than one batch of B (program/micro_batch.py), whose
calls run k times. The constants are order-of-magnitude figures for the generated scalar C,
with their sources next to them. Only their ratios matter to the plan (keep vs recompute vs
page vs micro-batches); overheads are reported relative to one plain step in the same model,
so no absolute claim rests on them.
"""

from __future__ import annotations

import math

from tvm import prim, tirx

from ..program.ir import Call, Program
from ..program.micro_batch import call_repeats
from ..targets import CostProfile


def _iterations(stmt, extent: int = 1) -> int:
    """Innermost statements executed, summed over the loop nests of a lowered PrimFunc."""
    if isinstance(stmt, tirx.For):
        n = stmt.extent
        return _iterations(stmt.body, extent * (int(n) if isinstance(n, prim.IntImm) else 1))
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_iterations(s, extent) for s in stmt.seq)
    if isinstance(stmt, tirx.BufferStore):
        return extent
    if isinstance(stmt, tirx.IfThenElse):
        both = [_iterations(stmt.then_case, extent)]
        if stmt.else_case is not None:
            both.append(_iterations(stmt.else_case, extent))
        return max(both)
    body = getattr(stmt, "body", None)
    return _iterations(body, extent) if body is not None else 0


class KernelWork:
    """Loop iterations per kernel name, read from the library's lowered TIR (cached)."""

    def __init__(self, library):
        self.library = library
        self._cache: dict[str, int] = {}

    def __call__(self, call: Call) -> int:
        if call.builtin:  # copies, masks, checks: one pass over their tensors
            return sum(math.prod(a.shape) for a in call.args)
        if call.kernel not in self._cache:
            func = self.library.lowered.get(call.kernel)
            if func is not None:
                work = _iterations(func.body)
            else:  # a micro-kernel printed from a template: its tensors' elements
                work = sum(math.prod(a.shape) for a in call.args)
            self._cache[call.kernel] = max(work, 1)
        return self._cache[call.kernel]

    def program(self, program: Program) -> int:
        """Iterations of one step (a micro-batch loop's calls counted k times)."""
        return sum(n * self(c) for n, c in zip(call_repeats(program), program.calls))

    def seconds(self, calls: list[Call], profile: CostProfile, repeats: int = 1) -> float:
        """Seconds of running `calls` `repeats` times in the cost model."""
        kernels = sum(not c.builtin or bool(c.args) for c in calls)  # loop markers are free
        return repeats * (sum(self(c) for c in calls) * profile.seconds_per_iteration
                          + kernels * profile.call_seconds)

    def step_seconds(self, program: Program, profile: CostProfile) -> float:
        """Seconds of one step of `program` in the cost model."""
        return sum(self.seconds([c], profile, n)
                   for n, c in zip(call_repeats(program), program.calls))
