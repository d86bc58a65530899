"""Does a memory plan fit a board? Checked at compile time, before any C is written."""

from __future__ import annotations

import numpy as np

from ..errors import CompileError
from .registry import Target

# The driver program's own static memory besides the arena and the batch buffers: its 4 KiB
# input buffer, newlib's stdio state, the reply chunk, the context. Measured with
# arm-none-eabi-size on the digits CNN's mps2-an386 build: about 6.9 KiB; rounded up.
DRIVER_OVERHEAD_BYTES = 8 * 1024


def _bytes(slot) -> int:
    return int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize


def sram_needed(target: Target, plan, inputs, labels, output) -> dict:
    io = sum(_bytes(x) for x in inputs) + _bytes(labels) + int(np.prod(output.shape)) * 4
    stack = target.board.stack_bytes
    total = plan.arena_bytes + io + stack + DRIVER_OVERHEAD_BYTES
    return {"arena": plan.arena_bytes, "io": io, "stack": stack,
            "driver": DRIVER_OVERHEAD_BYTES, "total": total}


def check_board_fit(target: Target, plan, inputs, labels, output,
                    weight_bytes: int = 0) -> None:
    """A CompileError with the numbers when the arena, the batch buffers and the stack
    cannot fit the board's SRAM together, or when the model's weights alone (`weight_bytes`:
    every state tensor's initial or frozen value is const data) cannot fit its flash."""
    if target.board is None:
        return
    board = target.board
    need = sram_needed(target, plan, inputs, labels, output)
    if need["total"] > board.sram_bytes:
        raise CompileError(
            f"target {target.name}: the plan does not fit the SRAM of {board.name} "
            f"({board.sram_bytes:,} B): arena {need['arena']:,} B + batch buffers "
            f"{need['io']:,} B + stack {need['stack']:,} B + driver {need['driver']:,} B = "
            f"{need['total']:,} B, {need['total'] - board.sram_bytes:,} B too many; use a "
            f"smaller batch, a smaller model or trainable=ub.SparseUpdate(...) to freeze "
            f"layers (frozen weights stay in flash)")
    if weight_bytes > board.flash_bytes:
        raise CompileError(
            f"target {target.name}: the model's weights ({weight_bytes:,} B, initial values "
            f"and frozen weights as const data) do not fit the flash of {board.name} "
            f"({board.flash_bytes:,} B), before any code; use a smaller model")
