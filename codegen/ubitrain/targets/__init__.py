"""Target descriptions: one place per target for compiler, flags, vector width and memory."""

from .registry import TARGETS, Target, get_target

__all__ = ["TARGETS", "Target", "get_target"]
