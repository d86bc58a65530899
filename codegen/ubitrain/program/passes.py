"""The rewrite passes of a compile, by name, each of which `ub.compile(disable_passes=...)` can
switch off. A rewrite changes how the step is computed, never what: with any of them off the
step trains the same model, only slower or in more memory; bit for bit, but for
`microkernels` (the templates sum in another order than the printed kernels) and
`fold_weight_transposes` (x @ W.T by the A·Bᵀ micro-kernel or by the A·B one over a copy of
W.T sums in another order). The fuzzer (fidelity/fuzz.py) compiles models with passes on
and off and compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError

PASSES = {
    "fold_weight_transposes": "a Linear layer reads its weight as stored (lowering/"
                              "transposed_matmul.py), no transposed copy",
    "fuse_kernels": "elementwise chains, epilogues and injective producers fused into one "
                    "kernel (lowering/fusion.py)",
    "microkernels": "conv, matmul, BatchNorm and pooling kernels from the ISA's templates "
                    "(kernels/microkernels/) instead of printed TIR",
    "output_reuse": "a fused kernel's intermediate kept in its output buffer "
                    "(kernels/tir_access.py)",
    "early_updates": "each optimizer update right after the last use of its parameter and "
                     "gradient (program/build.py)",
    "update_epilogues": "the optimizer update in the epilogue of a matmul weight gradient "
                        "(program/update_epilogue.py)",
    "pool_relu_grads": "the max-pool gradient and the ReLU gradient as one in-place kernel "
                       "(program/pool_relu.py)",
    "bn_activation_grads": "BatchNorm's backward takes in the activation's gradient mask "
                           "(program/bn_activation.py)",
    "depthwise_inputs_in_place": "the depthwise weight gradient reads x as stored "
                                 "(program/depthwise_input.py)",
    "share_in_place": "an elementwise kernel writes over an input that dies there "
                      "(program/inplace.py)",
    "fold_frozen_calls": "kernels over frozen weights evaluated at compile time, on targets "
                         "that keep frozen state in flash (program/frozen_state.py)",
}
# The passes that give the same step bit for bit when switched off.
BIT_EXACT = tuple(p for p in PASSES if p not in ("microkernels", "fold_weight_transposes"))


@dataclass(frozen=True)
class Passes:
    disabled: frozenset = frozenset()

    def on(self, name: str) -> bool:
        assert name in PASSES, name
        return name not in self.disabled


ALL_ON = Passes()


def passes(disable=()) -> Passes:
    """The passes with `disable` (names, or one name) switched off."""
    names = (disable,) if isinstance(disable, str) else tuple(disable or ())
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise CompileError(f"disable_passes: unknown pass {', '.join(map(repr, unknown))}; "
                           f"the passes are: {', '.join(PASSES)}")
    return Passes(frozenset(names))
