"""Placement of an int8 training step on a DSP target (`hexagon-v66`): each kernel call to the
DSP (HVX) or the CPU, by what the DSP may run and a cost model, minimising transfers
(Mandheling's CPU-DSP co-scheduling, docs/algorithms.md).

What the DSP may run (`dsp_may_run`): any kernel of the step over the arena. The float
input's quantization and the loss (they read the caller's input and labels) and the step's
bookkeeping (copies, checks: builtins) stay on the CPU. The step's kernels are portable C,
so one source builds for both sides.

Cost model (cycles, estimates for the kernels each side is meant to have, the `s8` micro-
kernels; today's plain-C kernels are slower on both): CPU (AArch64 NEON, 16 int8 lanes) work
/ 8 + 2 per int8 element touched; DSP (HVX, 128 int8 lanes) work / 64 + 0.25 per element,
where work is the kernel's loop iterations (memory/cost_model.py: one multiply-add or
elementwise operation each). Every tensor that crosses between the two costs
TRANSFER_CYCLES_PER_BYTE (cache maintenance of shared buffers), and every switch between
consecutive kernels on different sides one offload round trip (SWITCH_CYCLES). The placement
is the MILP over binary x_k (1 = DSP) with crossing variables t_e >= |x_producer -
x_consumer| per tensor and s_k >= |x_k - x_(k-1)| per switch, solved by scipy.optimize.milp
(HiGHS). With `ub.NITI(dsp_offload=True)` the generated C follows the plan (split.py);
otherwise the whole step runs on the target's own core and the placement is a report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..program.ir import Program

TRANSFER_CYCLES_PER_BYTE = 0.5
SWITCH_CYCLES = 20_000.0


@dataclass
class Placed:
    kernel: str
    where: str  # "dsp" or "cpu"
    dsp_allowed: bool
    cpu_cycles: float
    dsp_cycles: float


def dsp_may_run(call) -> bool:
    """A kernel over tensors of the arena (not the caller's), not a builtin."""
    return not call.builtin and not any(a.root.external for a in call.args)


def cycles(work: int, call) -> tuple[float, float]:
    """(CPU cycles, DSP cycles) of `call` doing `work` loop iterations."""
    elements = sum(math.prod(a.shape) for a in call.args if a.dtype == "int8")
    return work / 8 + 2 * elements, work / 64 + 0.25 * elements


def _edges(calls) -> list[tuple[int, int, int]]:
    """(producer call, consumer call, bytes) of every tensor passed between two calls."""
    edges, last_writer = [], {}
    for k, call in enumerate(calls):
        for s in call.reads:
            r = s.root
            if id(r) in last_writer and r.kind not in ("input", "label", "output"):
                edges.append((last_writer[id(r)], k, r.nbytes))
        for s in call.writes:
            last_writer[id(s.root)] = k
    return edges


def step_cycles(program: Program, placed: list[Placed], on_dsp) -> float:
    """The objective of the MILP for a given placement (one flag per call)."""
    total = sum(p.dsp_cycles if dsp else p.cpu_cycles for p, dsp in zip(placed, on_dsp))
    total += sum(b * TRANSFER_CYCLES_PER_BYTE for a, c, b in _edges(program.calls)
                 if on_dsp[a] != on_dsp[c])
    total += SWITCH_CYCLES * sum(on_dsp[k] != on_dsp[k - 1] for k in range(1, len(on_dsp)))
    return total


def place(program: Program, costs: Callable, allowed: Callable = dsp_may_run) -> list[Placed]:
    """Each call of `program` on the DSP or the CPU; `costs(call)`: (CPU cycles, DSP
    cycles), `allowed(call)`: whether the DSP may run it."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    calls = program.calls
    n = len(calls)
    placed = [Placed(call.kernel, "cpu", allowed(call), *costs(call)) for call in calls]
    edges = _edges(calls)
    m, v = len(edges), n + len(edges) + max(n - 1, 0)
    c = np.zeros(v)
    c[:n] = [p.dsp_cycles - p.cpu_cycles for p in placed]
    c[n:n + m] = [b * TRANSFER_CYCLES_PER_BYTE for _, _, b in edges]
    c[n + m:] = SWITCH_CYCLES
    rows, lower = [], []

    def absdiff(slack: int, a: int, b: int):  # slack >= x_a - x_b and slack >= x_b - x_a
        for sign in (1, -1):
            row = np.zeros(v)
            row[slack], row[a], row[b] = 1, -sign, sign
            rows.append(row)
            lower.append(0)

    for e, (a, b, _) in enumerate(edges):
        absdiff(n + e, a, b)
    for k in range(1, n):
        absdiff(n + m + k - 1, k, k - 1)
    upper = np.ones(v)
    upper[:n] = [1 if p.dsp_allowed else 0 for p in placed]
    result = milp(c, constraints=LinearConstraint(np.array(rows), lower, np.inf),
                  integrality=np.ones(v), bounds=Bounds(np.zeros(v), upper))
    x = np.round(result.x[:n]) if result.success else np.zeros(n)
    for p, on_dsp in zip(placed, x):
        p.where = "dsp" if on_dsp and p.dsp_allowed else "cpu"
    return placed


def placement_report(placed: list[Placed], program: Program | None = None) -> str:
    lines = [f"{'kernel':<52} {'on':<4} {'cpu cycles':>11} {'dsp cycles':>11}"]
    for p in placed:
        lines.append(f"{p.kernel:<52} {p.where:<4} {p.cpu_cycles:>11,.0f} "
                     f"{p.dsp_cycles if p.dsp_allowed else float('nan'):>11,.0f}")
    on_dsp = sum(p.where == "dsp" for p in placed)
    lines.append(f"{on_dsp} of {len(placed)} kernels on the DSP (HVX), the rest on the CPU")
    if program is not None:
        split = step_cycles(program, placed, [p.where == "dsp" for p in placed])
        cpu = step_cycles(program, placed, [False] * len(placed))
        lines.append(f"estimated step: {split:,.0f} cycles split, {cpu:,.0f} on the CPU alone "
                     f"({cpu / split:.2f}x; cost model estimates, not measurements)")
    return "\n".join(lines)
