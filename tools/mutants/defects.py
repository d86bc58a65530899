"""The mutants: one small, plausible defect each, in the generated C or in the compile.

A C mutant is `rewrite(model_c) -> (new text, where) | None`: None when the model has nothing
it applies to (the mutant is not exercised by that model). Each changes one kernel (with its
AVX2 and plain-lane helpers, so that whichever runs is the defective one), or one constant
wherever it is printed. A compile mutant is an instrument (`pipeline/instruments.py`) that
breaks one pass's legality check after the pass ran.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ubitrain.kernels.tir_access import in_place_pairs
from ubitrain.pipeline import Instrument
from ubitrain.program.inplace import SHAREABLE_KINDS

from .csource import backward_kernels, edit_first, functions

_UPDATE = re.compile(r"ub_f32_(?:sgd|adam|adamw)_update\w*__\w+$")


@dataclass(frozen=True)
class Mutant:
    name: str
    defect: str  # what is wrong, in a sentence
    rewrite: Callable[[str], tuple[str, str] | None] | None = None
    instrument: Callable[[], Instrument] | None = None


def _first_update_kernel(text: str) -> str | None:
    """The first optimizer update kernel defined (it updates one or a few parameters)."""
    fns = sorted(functions(text).values(), key=lambda f: f.start)
    return next((f.name for f in fns if _UPDATE.match(f.name)), None)


# ---- a gradient scaled by 1.01 ------------------------------------------------------------
def scale_gradient(text):
    kernel = _first_update_kernel(text)
    if kernel is None:
        return None

    def edit(body):
        return re.subn(r"\bgrad\[([^\]]+)\]", r"(1.01f * grad[\1])", body)
    return edit_first(text, [kernel], edit, "the gradient times 1.01")


# ---- one term of a gradient sum dropped ---------------------------------------------------
_SUM = re.compile(r"\((\w+)\[([^\[\]]+)\] \+ (\w+)\[([^\[\]]+)\]\)")


def drop_gradient_term(text):
    """Where a tensor feeds two ops, its gradient is the sum of two; the backward kernel
    that adds them (same index on both sides) keeps only the first."""
    def edit(body):
        def one(m):
            same = m.group(2) == m.group(4) and m.group(1) != m.group(3)
            return f"{m.group(1)}[{m.group(2)}]" if same else m.group(0)
        new = _SUM.sub(one, body)
        return new, int(new != body)
    return edit_first(text, backward_kernels(text), edit, "the second term of a gradient sum "
                     "dropped")


# ---- BatchNorm's eps and momentum ---------------------------------------------------------
# float32 (hex or decimal) or, where the statistics accumulate in double, a double literal
_EPS = re.compile(r"0x1\.4f8b588e368f1p-17|9\.99999974737875\d*e-06f|(?<![\w.])1e-05(?![\w.])")


def batch_norm_eps(text):
    """eps 1e-5 printed as 1e-4 (everywhere it is printed: BatchNorm's, in train and
    predict; LayerNorm's too where its eps is 1e-5)."""
    def swap(m):
        if m.group(0) == "1e-05":
            return "1e-04"
        return "0x1.a36e2eb1c432dp-14" if m.group(0).startswith("0x") else \
            "9.9999997473787516e-05f"
    new, n = _EPS.subn(swap, text)
    return (new, f"eps 1e-5 as 1e-4 ({n} places)") if n else None


_RUNNING = re.compile(r"(new_(?:mean|var)\[c\] = running_(?:mean|var)\[c\] \* )"
                      r"(0x[0-9a-f.]+p[-+]\d+)f( \+ .*? \* )(0x[0-9a-f.]+p[-+]\d+)f;")


def batch_norm_momentum(text):
    """The running statistics' momentum a tenth of the model's: 0.01 for PyTorch's 0.1
    (Keras' 0.99 read the other way), new = 0.99 old + 0.01 batch. (Set to 0.01 outright, it
    was no defect on a model whose momentum is 0.01 already: mobilenet_v3_small.)"""
    def edit(body):
        def one(m):
            keep, take = float.fromhex(m.group(2)), float.fromhex(m.group(4))
            momentum = 1.0 - keep  # `take` is momentum, or momentum * n / (n - 1)
            return (f"{m.group(1)}{1.0 - momentum / 10:.9g}f{m.group(3)}"
                    f"{take / 10:.9g}f;")
        return _RUNNING.subn(one, body)
    names = [name for name in functions(text) if "batch_norm_stats" in name]
    entries = [n for n in names if not any(n != m and n.startswith(m) for m in names)]
    return edit_first(text, entries, edit, "momentum a tenth")


# ---- the last iteration of a loop skipped -------------------------------------------------
_LOOP = re.compile(r"for \(int32_t (k\w*) = 0; \1 < (\d+); \+\+\1\)")


def skip_last_iteration(text):
    """The first reduction loop (a k axis, two iterations or more) of the backward's first
    bias gradient sum (collapse_sum) that has one stops one short. (At batch 1 the first
    such sum, a linear head's, sums one sample: no loop.)"""
    def edit(body):
        def one(m):
            return f"for (int32_t {m.group(1)} = 0; {m.group(1)} < {int(m.group(2)) - 1}; " \
                f"++{m.group(1)})"
        for m in _LOOP.finditer(body):  # not an accumulator's initialisation (k3_init)
            if int(m.group(2)) >= 2 and not m.group(1).endswith("_init"):
                return body[:m.start()] + one(m) + body[m.end():], 1
        return body, 0
    kernels = [k for k in backward_kernels(text) if "collapse_sum" in k]
    return edit_first(text, kernels, edit, "a reduction loop one short")


# ---- a kink rule flipped from < to <= ----------------------------------------------------
_KINK = [(re.compile(r"\((0\.0f) < (\w+\[)"), r"(\1 <= \2"),
         (re.compile(r"(0x0\.0p\+0f) < \("), r"\1 <= ("),
         (re.compile(r"(_mm256_set1_ps\(0x0\.0p\+0f\)), _CMP_GT_OQ\)"), r"\1, _CMP_GE_OQ)")]


def flip_kink_rule(text):
    """The first backward kernel with a ReLU-like mask (0 < z: the gradient passes) lets
    z = 0 through too: the elements the activation clamped to 0."""
    def edit(body):
        total = 0
        for pattern, repl in _KINK:
            body, n = pattern.subn(repl, body)
            total += n
        return body, total
    return edit_first(text, backward_kernels(text), edit, "0 < z as 0 <= z")


# ---- a weight-decay term missing ----------------------------------------------------------
# grad[i] + wd * w[i]; the index any expression (a 2-D loop's: ((i0 * 154) + i1), gru_kws)
_DECAY = re.compile(r"\(grad\[([^\[\]]+)\] \+ \([-0-9.e+]+f \* \w+\[\1\]\)\)")


def drop_weight_decay(text):
    """The first update kernel forgets weight decay: g, not g + wd * w."""
    kernel = _first_update_kernel(text)
    if kernel is None:
        return None

    def edit(body):
        return _DECAY.subn(r"grad[\1]", body)
    return edit_first(text, [kernel], edit, "g + wd * w as g")


# ---- an in-place share that reads an overwritten value ------------------------------------
class StaleInPlace(Instrument):
    """After share_in_place: the first forward call whose output could be written over an
    input, but for that input being read again later, is made to write over it (the pass's
    last-use check off by one). A later call then reads the overwritten value."""

    def __init__(self):
        self.where = None

    def after(self, step, unit) -> None:
        if step.name != "share_in_place" or unit.train is None:
            return
        calls, library = unit.train.calls, unit.library
        loss = next((i for i, c in enumerate(calls) if c.kernel == "ub_check_loss"), len(calls))
        readers: dict = {}
        for i, c in enumerate(calls):
            for s in c.args:
                readers.setdefault(s.root, []).append(i)
        for i, call in enumerate(calls[:loss]):
            if call.builtin or call.kernel not in library.lowered:
                continue
            for k, o in in_place_pairs(library.lowered[call.kernel]):
                src, dst = call.args[k], call.args[o]
                if (src.root.kind in SHAREABLE_KINDS and dst.view_of is None
                        and dst.kind in SHAREABLE_KINDS and dst.dtype == src.root.dtype
                        and dst.nbytes == src.root.nbytes and readers[src.root][-1] > i
                        and readers[dst.root][0] == i):
                    dst.view_of, dst.in_place = src, True
                    call.kernel = library.in_place_variant(call.kernel, {k: o}).name
                    self.where = f"{call.kernel} writes over {src.name}, read again at call " \
                        f"{readers[src.root][-1]}"
                    return


MUTANTS = [
    Mutant("gradient_x1.01", "a gradient scaled by 1.01 (the first update kernel's)",
           rewrite=scale_gradient),
    Mutant("drop_sum_term", "one term of a gradient sum dropped (a fan-out's backward add)",
           rewrite=drop_gradient_term),
    Mutant("bn_eps", "BatchNorm's eps 1e-4 instead of 1e-5", rewrite=batch_norm_eps),
    Mutant("bn_momentum", "BatchNorm's momentum a tenth (0.01 for 0.1; one layer's kernel)",
           rewrite=batch_norm_momentum),
    Mutant("skip_last_iteration", "the last iteration of a loop skipped (a bias gradient's "
           "reduction)", rewrite=skip_last_iteration),
    Mutant("kink_le", "a kink rule flipped from < to <= (a ReLU-like backward mask)",
           rewrite=flip_kink_rule),
    Mutant("no_weight_decay", "a weight-decay term missing (the first update kernel's)",
           rewrite=drop_weight_decay),
    Mutant("stale_in_place", "an in-place share that reads an overwritten value",
           instrument=StaleInPlace),
]


# no defect: the C as generated, judged the same way (it must match, or the kills say nothing)
BASELINE = Mutant("baseline", "no defect", rewrite=lambda text: (text, "no change"))


def mutant(name: str, suite=None) -> Mutant:
    """The mutant `name` of `suite` (by default the float ones, MUTANTS), or BASELINE."""
    suite = MUTANTS if suite is None else suite
    for m in [BASELINE, *suite]:
        if m.name == name:
            return m
    raise KeyError(f"no mutant {name!r}; known: {', '.join(m.name for m in suite)}")
