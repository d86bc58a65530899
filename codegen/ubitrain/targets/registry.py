"""The targets ubitrain can compile for, each described in one place."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    isa: str  # kernel variant token (CONVENTIONS.md): scalar, neon, hvx, cmsis_dsp
    alignment: int  # arena and buffer alignment in bytes
    runs_on_host: bool
    accumulate_dtype: str = "float64"  # reductions' accumulator; float32 without a DP FPU
    cmake_args: tuple[str, ...] = ()


TARGETS = {
    t.name: t
    for t in (
        Target("host", "this machine's C compiler (plain C99 scalar kernels)", "scalar", 16,
               True),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise CompileError(f"unknown target {name!r}; available targets: "
                           f"{', '.join(TARGETS)}") from None
