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
from dataclasses import dataclass

from tvm import prim, tirx

from ..program.ir import Call, Program
from ..program.micro_batch import call_repeats


@dataclass(frozen=True)
class CostProfile:
    name: str
    seconds_per_iteration: float
    write_bytes_per_second: float  # sustained page-out bandwidth, erase included
    read_bytes_per_second: float
    latency_seconds: float  # per page-in or page-out (command, seek, erase setup)
    call_seconds: float  # per kernel call, on top of its iterations
    source: str

    def page_out(self, nbytes: int) -> float:
        return self.latency_seconds + nbytes / self.write_bytes_per_second

    def page_in(self, nbytes: int) -> float:
        return self.latency_seconds + nbytes / self.read_bytes_per_second


PROFILES = {
    "host": CostProfile(
        "host", 1.0e-9, 1.0e9, 2.0e9, 20e-6, 20e-9,
        "x86-64 at ~3 GHz running the -O3 scalar kernels at ~3 cycles per iteration; per "
        "call ~60 cycles (benchmarks/micro_batch_speed.py: digits_cnn at batch 16 as 16 "
        "micro-batches runs 16x the calls in 1.10-1.12x the time of one batch, where "
        "iterations alone predict 1.15x, so the per-call cost is below what it resolves); a "
        "page is a file on an NVMe SSD through the OS page cache (~1 GB/s write, ~2 GB/s "
        "read, ~20 us per fopen/fwrite/fclose in ub_storage_file.c)"),
    "aarch64-neon": CostProfile(
        "aarch64-neon", 1.5e-9, 0.5e9, 1.0e9, 100e-6, 150e-9,
        "Cortex-A76-class phone core at 2.4 GHz, ~3.5 cycles per scalar iteration, ~350 "
        "cycles per call as for the host; UFS 3.1 "
        "storage, conservative sustained figures (JEDEC UFS 3.1 lanes run 2.9 GB/s raw; "
        "phones measure 0.5-1.2 GB/s sequential write), ~100 us per file operation"),
    "hexagon-v66": CostProfile(
        "hexagon-v66", 4.0e-9, 0.5e9, 1.0e9, 100e-6, 300e-9,
        "Hexagon v66 scalar unit at ~1 GHz, 4 cycles per iteration of scalar C (no HVX in "
        "the printed kernels), ~300 cycles per call; pages go to the phone's UFS storage "
        "as for aarch64-neon"),
    "cortex-m4": CostProfile(
        "cortex-m4", 60e-9, 80e3, 13e6, 50e-6, 1.2e-6,
        "STM32F4-class Cortex-M4F at 168 MHz, ~10 cycles per scalar iteration (loads, "
        "FMA, store, index arithmetic; ARM Cortex-M4 TRM: VFMA 3 cycles), ~200 cycles per "
        "call (no cache: a call is its prologue, argument checks and loop set-up); paging to an "
        "external SPI NOR flash such as the Winbond W25Q128JV (datasheet: page program "
        "0.4 ms per 256 B, 4 KiB sector erase 45 ms typical -> ~80 KB/s sustained write; "
        "single-SPI read at 104 MHz -> ~13 MB/s)"),
    "cortex-m7": CostProfile(
        "cortex-m7", 30e-9, 80e3, 50e6, 50e-6, 0.9e-6,
        "STM32F7-class Cortex-M7 at 216 MHz, dual-issue, ~6 cycles per scalar iteration, "
        "~200 cycles per call as for cortex-m4; "
        "the same W25Q128JV NOR flash over quad-SPI (read ~50 MB/s at 104 MHz x4, write "
        "bound by program and erase times as for cortex-m4)"),
}


def profile_for(target: str) -> CostProfile:
    return PROFILES.get(target, PROFILES["host"])


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
