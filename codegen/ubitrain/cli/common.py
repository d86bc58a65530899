"""What the commands share: the argument parser's style, one-line usage errors, and the
progress switch."""

from __future__ import annotations

import argparse
import sys

PRECISIONS = ("fp32", "int8")  # pipeline/__init__.py PIPELINES (not imported: start-up time)


def formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30)


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, `error: ...`, and status 2, like every other error."""

    def error(self, message):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def progress(args) -> bool | None:
    """--no-progress turns the bars off; otherwise they show on a terminal."""
    return False if args.no_progress else None


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ubitrain")
    except PackageNotFoundError:
        return "unknown"
