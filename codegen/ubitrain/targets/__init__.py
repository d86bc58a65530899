"""Target descriptions: one place per target for compiler, flags, vector width and memory."""

from .fit import check_board_fit
from .registry import TARGETS, Board, Target, get_target

__all__ = ["TARGETS", "Board", "Target", "check_board_fit", "get_target"]
