"""NITI's integer weight update and its mu schedule, as the optimizer of precision="int8".

    g8 = PstoShift(G32, bitlen(max|G32|) - mu);  w8 = clip(w8 - g8, -127, 127)

There is no learning rate: the largest step of a layer is about 2^mu - 1 LSBs of its weight,
whatever the gradient's scale. mu falls over training (NITI: 5, then 4, then 3): `mu[i]`
holds from step `milestones[i-1]` (0 for the first) until `milestones[i]`, counting completed
training steps.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..errors import CompileError

# Where the CPU part of a split step (dsp_offload) can run.
CPU_TARGETS = ("host", "aarch64-neon")
WEIGHT_EXPONENTS = ("tensor", "channel")
BATCH_NORMS = ("fold", "integer")  # folded into the conv before it, or NITI's own with batch
# statistics (niti/batch_norm.py); NITI(batch_norm="auto") picks one per model


@dataclass(frozen=True)
class NITI:
    """precision="int8" training: the mu schedule and self-adaptive rescaling.

    adaptive_rescale: reuse each tensor's previous shift instead of reducing for its maximum
    every step (rescale.py); max_interval bounds the steps between two reductions.
    float_fallback: no longer needed: every function niti/tables.py has (GELU, Sigmoid, Tanh,
    SiLU, Hardswish, Hardsigmoid) runs as compile-time tables anyway; still checked, so that
    naming an op without a table is an error.
    dsp_offload: with target="hexagon-v66", split the step into a CPU part and a DSP part
    (Hexagon) by the placement (offload/placement.py, offload/split.py).
    cpu_target: where the CPU part of a split step runs: "host" (loaded in this process) or
    "aarch64-neon" (the Android CPU, run under qemu-aarch64).
    batch_norm: "fold" (each BatchNorm folded into the conv or linear before it, with its
    running statistics) or "integer" (NITI's integer BatchNorm with batch statistics,
    niti/batch_norm.py); "auto" chooses per model
    (training/batch_norm_folding.py batch_norm_mode): "integer" for a net whose BatchNorms
    have never seen a batch (trained from scratch), "fold" for a trained one (fine-tuning).
    weight_exponents: "tensor" (one exponent per weight) or "channel" (one per output
    channel of a conv or linear weight, niti/channel_exponents.py);
    "auto" chooses (training/batch_norm_folding.py weight_exponents_mode): "channel" where
    BatchNorms are folded (folding spreads the channels' scales), else "tensor"."""

    mu: tuple[int, ...] = (5, 4, 3)
    milestones: tuple[int, ...] = (200, 400)
    adaptive_rescale: bool = False
    max_interval: int = 64
    float_fallback: tuple[str, ...] = ()
    dsp_offload: bool = False
    cpu_target: str = "host"
    batch_norm: str = "auto"
    weight_exponents: str = "auto"

    def __post_init__(self):
        mu, milestones = tuple(self.mu), tuple(self.milestones)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "milestones", milestones)
        object.__setattr__(self, "float_fallback", tuple(self.float_fallback))
        from ..niti.tables import FUNCTIONS
        unknown = [op for op in self.float_fallback if op not in FUNCTIONS]
        if unknown:
            raise CompileError(f"NITI(float_fallback={unknown}): a float fallback exists for "
                               f"the elementwise ops {', '.join(FUNCTIONS)} only")
        if not mu or any(not 1 <= m <= 7 for m in mu):
            raise CompileError(f"NITI(mu={mu}): each mu must be in [1, 7] (the largest update "
                               "of a step is 2^mu - 1 LSBs)")
        if len(milestones) != len(mu) - 1 or list(milestones) != sorted(set(milestones)) \
                or any(m < 1 for m in milestones):
            raise CompileError(f"NITI(mu={mu}, milestones={milestones}): give one increasing "
                               f"positive step count per change of mu ({len(mu) - 1} here)")
        if self.cpu_target not in CPU_TARGETS:
            raise CompileError(f"NITI(cpu_target={self.cpu_target!r}): the CPU part of a split "
                               f"step runs on one of {', '.join(CPU_TARGETS)}")
        if self.batch_norm not in ("auto", *BATCH_NORMS):
            raise CompileError(f"NITI(batch_norm={self.batch_norm!r}): give one of "
                               f"{', '.join(map(repr, ('auto', *BATCH_NORMS)))}")
        if self.weight_exponents not in ("auto", *WEIGHT_EXPONENTS):
            raise CompileError(f"NITI(weight_exponents={self.weight_exponents!r}): give one of "
                               f"{', '.join(map(repr, ('auto', *WEIGHT_EXPONENTS)))}")
        if not 1 <= self.max_interval <= 1 << 20:
            raise CompileError(f"NITI(max_interval={self.max_interval}) must be in [1, 2^20]")

    def mu_at(self, completed_steps: int) -> int:
        return self.mu[bisect.bisect_right(self.milestones, completed_steps)]

    # ---- as the optimizer of the step program (program/optimizer_update.py) ----------------
    state_names = ()  # no momentum: the rule reads the gradient alone

    def coefficient_code(self) -> list[str]:
        """mu for this step (`step` counts from 1), as C."""
        code = str(self.mu[-1])
        for milestone, mu in reversed(list(zip(self.milestones, self.mu))):
            code = f"(step - 1) < {milestone} ? {mu} : {code}"
        return [f"(float)({code})"]

    def update_inputs(self, name: str, state: dict) -> list:
        """A weight with an exponent per channel: the update reads them. `name`: the weight's
        (a part trained by channels holds its first rows, so its channel c is the weight's)."""
        exponent = state.get(f"{name}.exponent")
        return [exponent] if exponent is not None and exponent.shape != (1,) else []

    def update(self, param, grad, states, coef, exponents=None):
        # here, not at the top: a trainer (load_package, a fleet client) needs NITI's
        # settings, not TVM, which takes seconds to import
        from ..lowering.niti_kernels import niti_update

        return niti_update(param, grad, coef, exponents)
