"""What a target's kernels, calls and pages cost: the figures behind the budget solver's
objective (memory/cost_model.py). The constants are order-of-magnitude figures for the
generated scalar C, with their sources next to them; only their ratios matter to a plan."""

from __future__ import annotations

from dataclasses import dataclass


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


HOST = CostProfile(
    "host", 1.0e-9, 1.0e9, 2.0e9, 20e-6, 20e-9,
    "x86-64 at ~3 GHz running the -O3 scalar kernels at ~3 cycles per iteration; per "
    "call ~60 cycles (benchmarks/micro_batch_speed.py: digits_cnn at batch 16 as 16 "
    "micro-batches runs 16x the calls in 1.10-1.12x the time of one batch, where "
    "iterations alone predict 1.15x, so the per-call cost is below what it resolves); a "
    "page is a file on an NVMe SSD through the OS page cache (~1 GB/s write, ~2 GB/s "
    "read, ~20 us per fopen/fwrite/fclose in ub_storage_file.c)")


PHONE_CPU = CostProfile(
    "aarch64-neon", 1.5e-9, 0.5e9, 1.0e9, 100e-6, 150e-9,
    "Cortex-A76-class phone core at 2.4 GHz, ~3.5 cycles per scalar iteration, ~350 "
    "cycles per call as for the host; UFS 3.1 "
    "storage, conservative sustained figures (JEDEC UFS 3.1 lanes run 2.9 GB/s raw; "
    "phones measure 0.5-1.2 GB/s sequential write), ~100 us per file operation")


HEXAGON = CostProfile(
    "hexagon-v66", 4.0e-9, 0.5e9, 1.0e9, 100e-6, 300e-9,
    "Hexagon v66 scalar unit at ~1 GHz, 4 cycles per iteration of scalar C (no HVX in "
    "the printed kernels), ~300 cycles per call; pages go to the phone's UFS storage "
    "as for aarch64-neon")


CORTEX_M4 = CostProfile(
    "cortex-m4", 60e-9, 80e3, 13e6, 50e-6, 1.2e-6,
    "STM32F4-class Cortex-M4F at 168 MHz, ~10 cycles per scalar iteration (loads, "
    "FMA, store, index arithmetic; ARM Cortex-M4 TRM: VFMA 3 cycles), ~200 cycles per "
    "call (no cache: a call is its prologue, argument checks and loop set-up); paging to an "
    "external SPI NOR flash such as the Winbond W25Q128JV (datasheet: page program "
    "0.4 ms per 256 B, 4 KiB sector erase 45 ms typical -> ~80 KB/s sustained write; "
    "single-SPI read at 104 MHz -> ~13 MB/s)")


CORTEX_M7 = CostProfile(
    "cortex-m7", 30e-9, 80e3, 50e6, 50e-6, 0.9e-6,
    "STM32F7-class Cortex-M7 at 216 MHz, dual-issue, ~6 cycles per scalar iteration, "
    "~200 cycles per call as for cortex-m4; "
    "the same W25Q128JV NOR flash over quad-SPI (read ~50 MB/s at 104 MHz x4, write "
    "bound by program and erase times as for cortex-m4)")
