"""The errors ubitrain raises. Every message names what is at fault and what would work."""


class UbitrainError(Exception):
    """Base of every error ubitrain raises on purpose."""


class CompileError(UbitrainError):
    """A model, option or budget that cannot be compiled."""


class UnsupportedOpError(CompileError):
    """An operator of the model has no ubitrain lowering."""


class InputError(UbitrainError, ValueError):
    """A batch, label array or parameter handed to a trainer does not fit the compiled step."""


class BuildError(UbitrainError):
    """The generated C project did not build."""


class RuntimeStatusError(UbitrainError):
    """The generated C returned an error status."""


class UbitrainWarning(UserWarning):
    """A compile that works but differs from what the user may expect (e.g. BatchNorm
    statistics per micro-batch, a budget plan stopped at the solver's time limit)."""


def warn(message: str) -> None:
    """A UbitrainWarning shown at the user's line: the first caller outside ubitrain."""
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UbitrainWarning, stacklevel=level)
