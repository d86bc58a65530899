"""Targets: each described in one place, the one oracle for every target question (kernel ISA
per dtype, accumulator, cost profile, board memory, DSP, toolchain, emulator)."""

from .cost_profiles import CostProfile
from .fit import check_board_fit
from .registry import TARGETS, Board, Target, get_target

__all__ = ["TARGETS", "Board", "CostProfile", "Target", "check_board_fit", "get_target"]
