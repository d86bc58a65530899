"""`memory_budget=`: parse a budget and hold the plan to it."""

from __future__ import annotations

import re

from ..errors import CompileError
from .plan import MemoryPlan

UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2,
         "gb": 1000**3, "gib": 1024**3}


def parse_bytes(budget) -> int:
    if isinstance(budget, int) and budget > 0:
        return budget
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(budget))
    if not m or m.group(2).lower() not in UNITS:
        raise CompileError(f"memory_budget={budget!r} is not a size; give bytes (262144) or a "
                           "string such as '256KiB' or '1.5MB'")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def check_budget(plan: MemoryPlan, budget) -> None:
    limit = parse_bytes(budget)
    if plan.arena_bytes > limit:
        raise CompileError(
            f"memory_budget={budget!r} ({limit:,} bytes) is below this model's arena of "
            f"{plan.arena_bytes:,} bytes at this batch size; the smallest budget that works "
            f"without rematerialization is {plan.arena_bytes:,} bytes (lower bound "
            f"{plan.lower_bound_bytes:,}); use a smaller batch or a larger budget")
