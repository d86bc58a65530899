"""The int8 mutants: one small, plausible defect each in the C of the int8 (NITI) training
step (pipeline/int8.py), for the numpy reference to catch (fidelity/niti_check.py).

Each is a rewrite of `model.c` as the float ones are (defects.py: `rewrite(text) -> (new
text, where) | None`), of one kernel (with its helpers) unless it is a constant: the first
kernel the train step calls (`forward`) or calls after its loss (`backward`) that has
something to change. None: the model has nothing the defect applies to.
"""

from __future__ import annotations

import re

from .csource import backward_kernels, edit_first, functions, train_calls
from .defects import Mutant, skip_last_iteration


def _forward_kernels(text: str) -> list[str]:
    calls, loss = train_calls(text)
    return list(dict.fromkeys(calls[:loss]))


def _one(pattern: re.Pattern, repl):
    """An edit: every match of `pattern` in a kernel's body replaced."""
    return lambda body: pattern.subn(repl, body)


# ---- a rounding shift off by one ----------------------------------------------------------
# the shift that brings an int32 tensor to 8 bits: bit length of its largest magnitude - 7
_SHIFT = re.compile(r"(\w+_exact\[0\] = UB_MAX\(\(\w+_bits\[0\] - )7\)")


def rescale_shift(text):
    """The first rescale of the forward shifts one bit more than it must (bits - 6): one bit
    of precision lost, the exponent one higher."""
    return edit_first(text, _forward_kernels(text), _one(_SHIFT, r"\g<1>6)"),
                     "the 8-bit shift one bit too far")


# ---- round half handled wrongly -----------------------------------------------------------
# a negative value's round half away from zero: -(((1 << (s - 1)) - x) >> s)
_HALF = re.compile(r"\(\(INT64_C\(1\) << \(\(\(int64_t\)(\w+)\[0\]\) - INT64_C\(1\)\)\) - ")


def round_half_toward_zero(text):
    """Every rescale (the op's lowering: its kernels all print the same rule) rounds a
    negative value's half toward zero (-2.5 -> -2), its positive halves still away
    (2.5 -> 3): the asymmetric rounding of an arithmetic shift. (In one kernel only, the
    first forward rescale, it changes no number of a chain: that rescale feeds a ReLU alone,
    which maps -2 and -3 alike to 0.)"""
    total, kernels = 0, 0
    for f in sorted(functions(text).values(), key=lambda f: -f.start):  # last first
        if "niti_rescale" in f.name:
            body, n = _HALF.subn(r"(((INT64_C(1) << (((int64_t)\1[0]) - INT64_C(1))) - "
                                 r"INT64_C(1)) - ", text[f.start:f.end])
            text, total, kernels = text[:f.start] + body + text[f.end:], total + n, kernels + 1
    return (text, f"negative halves rounded toward zero in {kernels} rescale functions "
            f"({total} places)") if total else None


# ---- a saturation bound 127 vs 128 --------------------------------------------------------
_SATURATE = re.compile(r"INT64_C\(127\)\), INT64_C\(-127\)\)")


def saturate_128(text):
    """Every int8 saturation clips to [-128, 127] (int8's range), not NITI's symmetric
    [-127, 127] (everywhere it is printed: rescales and the weight update)."""
    new, n = _SATURATE.subn("INT64_C(127)), INT64_C(-128))", text)
    return (new, f"int8 saturated at -128 ({n} places)") if n else None


# ---- a residual sum's backward dropping a term --------------------------------------------
_INT8_ARGS = re.compile(r"const int8_t \*restrict (\w+)")


def drop_align_term(text):
    """The backward's first aligned sum of two int8 tensors (a fan-out's gradient: a residual)
    keeps the first and reads the second as 0."""
    def edit(body):
        args = _INT8_ARGS.findall(body[:body.find("{")])
        if len(args) < 2:
            return body, 0
        return re.subn(rf"\b{args[1]}\[[^\[\]]+\]", "0", body)
    kernels = [k for k in backward_kernels(text) if "niti_align_add" in k]
    return edit_first(text, kernels, edit, "the second term of an aligned sum dropped")


# ---- the ReLU backward mask < as <= -------------------------------------------------------
_MASK = re.compile(r"\(0 < (\w+\[[a-z_]\w*\])")  # z[i] (not a scalar's [0]: a shift)


def relu_mask_le(text):
    """The first backward kernel with a ReLU mask (0 < z ? gradient : 0, a `where`) lets
    z = 0 through too: in int8 every element the ReLU clipped, and every one rounded to 0."""
    kernels = [k for k in backward_kernels(text) if "where" in k]
    return edit_first(text, kernels, _one(_MASK, r"(0 <= \1"), "0 < z as 0 <= z")


# ---- the weight update's mu off by one ----------------------------------------------------
_MU = re.compile(r"\(\(int32_t\)coef\[0\]\)")


def mu_off_by_one(text):
    """The backward's first int8 weight update renormalises its gradient to mu - 1 bits, not
    mu. (A bias's update is not chosen: where its gradient has fewer than mu + 8 bits the
    shift is 0 with either mu, and the defect changes no number.)"""
    kernels = [k for k in backward_kernels(text) if k.startswith("ub_s8_niti_update")]
    return edit_first(text, kernels, _one(_MU, "(((int32_t)coef[0]) - 1)"), "mu - 1 for mu")


INT8_MUTANTS = [
    Mutant("shift_off_by_one", "a rounding shift off by one (the first forward rescale's)",
           rewrite=rescale_shift),
    Mutant("round_half", "round half toward zero for negatives (every rescale)",
           rewrite=round_half_toward_zero),
    Mutant("saturate_128", "int8 saturation at -128, not -127 (everywhere)",
           rewrite=saturate_128),
    Mutant("drop_sum_term", "a residual sum's backward dropping a term (an aligned int8 sum)",
           rewrite=drop_align_term),
    Mutant("relu_le", "the ReLU backward mask 0 < z as 0 <= z", rewrite=relu_mask_le),
    Mutant("skip_last_iteration", "the last iteration of a loop skipped (a bias gradient's "
           "reduction)", rewrite=skip_last_iteration),
    Mutant("mu_off_by_one", "the weight update's mu off by one (the first update kernel's)",
           rewrite=mu_off_by_one),
]
