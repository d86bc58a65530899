"""Progress bars for what takes seconds: compiling, solving, building, training in the demo.

A bar runs over a fixed list of named steps and shows the current one. Bars go to stderr and,
unless asked for explicitly, only to a terminal, so that logs, pipes and tests stay clean.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def wanted(progress: bool | None) -> bool:
    """`None` means: when stderr is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def bar(iterable, desc: str, progress: bool | None, unit: str = "batch"):
    """A bar over `iterable` (training batches, sweep points)."""
    return tqdm(iterable, desc=desc, unit=unit, leave=False, file=sys.stderr,
                disable=not wanted(progress), dynamic_ncols=True)


class Steps:
    """`with Steps("compile", ["trace", "lower"]) as step: step("trace"); ...; step("lower")`"""

    def __init__(self, desc: str, steps: list[str], progress: bool | None = None):
        self.steps = steps
        self._bar = tqdm(total=len(steps), desc=desc, leave=False, file=sys.stderr,
                         disable=not wanted(progress), dynamic_ncols=True,
                         bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar:20}| "
                                    "{postfix} [{elapsed}]")
        self._current: str | None = None

    def __call__(self, name: str) -> None:
        """Finish the current step and start `name`."""
        if name not in self.steps:
            raise ValueError(f"unknown progress step {name!r}; steps: {self.steps}")
        if self._current is not None:
            self._bar.update(1)
        self._current = name
        self._bar.set_postfix_str(name)

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc) -> None:
        if self._current is not None and exc[0] is None:
            self._bar.update(1)
        self._bar.close()
