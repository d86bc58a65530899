"""Elementwise functions NITI has no integer rule for (GELU, Sigmoid, Tanh, SiLU, Hardswish,
Hardsigmoid) as compile-time tables: the spec that the int8 pipeline (training/niti_rules.py,
lowering/niti_kernels.py) and its numpy reference (fidelity/niti_reference.py) follow.

The float function is evaluated at compile time, not on the device: for every input exponent
e in [E_LO, E_HI] and every int8 input q, a table holds f(q * 2^e) and one holds f'(q * 2^e),
each quantized to int8 with one exponent per table (quantize.py). The step stays integer:
forward y = F_e[q] (exponent of table e); backward err * D_e[q] accumulates in int32 and is
rescaled like any error (rescale.py). So the C equals the reference bit for bit. An input
exponent outside the range is brought to its edge first (RoundShift down from below E_LO, a
clipped left shift from above E_HI).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..niti.quantize import quantize

E_LO, E_HI = -16, 8
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf(x):
    from scipy.special import erf
    return erf(x)


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        inner = SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        t = np.tanh(inner)
        f = 0.5 * x * (1 + t)
        df = 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x ** 2)
        return f, df
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)
    return x * cdf, cdf + x * pdf


def _expit(x):
    from scipy.special import expit  # no overflow for large |x|
    return expit(x)


def _sigmoid(x):
    s = _expit(x)
    return s, s * (1 - s)


def _tanh(x):
    t = np.tanh(x)
    return t, 1 - t ** 2


def _silu(x):
    s = _expit(x)
    return x * s, s * (1 + x * (1 - s))


def _hardswish(x):
    """x relu6(x + 3) / 6; PyTorch's gradient: 0 up to -3, x / 3 + 1/2 up to 3 (not at
    it), 1 from 3."""
    f = x * np.clip(x + 3, 0, 6) / 6
    return f, np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0))


def _hardsigmoid(x):
    """relu6(x + 3) / 6; PyTorch's gradient: 1/6 strictly inside (-3, 3), else 0."""
    return np.clip(x + 3, 0, 6) / 6, np.where((x > -3) & (x < 3), 1 / 6, 0.0)


# op label -> (f, f') on float64 arrays; kwargs of the ATen call are passed on
FUNCTIONS = {"aten.gelu": _gelu, "aten.sigmoid": _sigmoid, "aten.tanh": _tanh,
             "aten.silu": _silu, "aten.hardswish": _hardswish,
             "aten.hardsigmoid": _hardsigmoid}


@functools.cache  # a model's every use of a function (forward, backward, predict) reads one
def tables(op: str, **kwargs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(F [n, 256] int8, F exponents [n], D [n, 256] int8, D exponents [n]) for the input
    exponents E_LO..E_HI; column q + 128 holds the value at int8 input q."""
    q = np.arange(-128, 128, dtype=np.float64)
    f_rows, f_exp, d_rows, d_exp = [], [], [], []
    for e in range(E_LO, E_HI + 1):
        f, df = FUNCTIONS[op](q * 2.0 ** e, **kwargs)
        for values, rows, exps in ((f, f_rows, f_exp), (df, d_rows, d_exp)):
            v, x = quantize(np.asarray(values, np.float32))
            rows.append(v)
            exps.append(x)
    return (np.stack(f_rows), np.array(f_exp, np.int32), np.stack(d_rows),
            np.array(d_exp, np.int32))


def table_index(q: np.ndarray, e: int) -> tuple[np.ndarray, int]:
    """int8 inputs q (exponent e) as table columns and the table row (rounding.py rules)."""
    from ..niti.rounding import clip8, round_shift
    if e < E_LO:
        q, e = clip8(round_shift(q, E_LO - e)), E_LO
    elif e > E_HI:
        q, e = clip8(np.asarray(q, np.int64) << min(e - E_HI, 8)), E_HI
    return np.asarray(q, np.int64) + 128, e - E_LO
