"""The polynomial coefficients of runtime_c/ub_math.h: least-squares fits in the Chebyshev
basis on Chebyshev nodes, in float64, converted to monomials and printed as the Horner forms
the header uses, with the largest error of their float32 evaluation.

    python scripts/fit_math.py
"""

import numpy as np
from scipy.special import erf, erfc


def fit(f, a: float, b: float, degree: int, nodes: int = 4000) -> np.ndarray:
    k = np.arange(nodes)
    u = (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (k + 0.5) / nodes)
    series = np.polynomial.chebyshev.Chebyshev.fit(u, f(u), degree, domain=[a, b])
    return series.convert(kind=np.polynomial.Polynomial).coef


def horner32(coef: np.ndarray, v: np.ndarray) -> np.ndarray:
    r = np.full_like(v, np.float32(coef[-1]))
    for c in coef[-2::-1]:
        r = (r * v + np.float32(c)).astype(np.float32)
    return r


def horner_c(coef: np.ndarray, var: str) -> str:
    s = f"{float(np.float32(coef[-1])):.9g}f"
    for c in coef[-2::-1]:
        s = f"({s} * {var} + {float(np.float32(c)):.9g}f)"
    return s


def ulps(got, want) -> float:
    return float(np.max(np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32))))


def main():
    # tanh(x) = x + x^3 P(x^2) for |x| < 0.625
    p = fit(lambda u: (np.tanh(np.sqrt(u)) / np.sqrt(u) - 1) / u, 1e-12, 0.625 ** 2, 5)
    x = np.linspace(1e-6, 0.625, 200001, dtype=np.float32)
    u = x * x
    err = ulps(x + x * u * horner32(p, u), np.tanh(x.astype(float)))
    print("tanh P(u) =", horner_c(p, "u"), f"  [{err:.2f} ulp]")
    # erf(x) = x P(x^2) for |x| < 1
    p = fit(lambda u: erf(np.sqrt(u)) / np.sqrt(u), 1e-12, 1.0, 6)
    x = np.linspace(1e-6, 1, 200001, dtype=np.float32)
    err = ulps(x * horner32(p, x * x), erf(x.astype(float)))
    print("erf P(u) =", horner_c(p, "u"), f"  [{err:.2f} ulp]")
    # erfc(x) = exp(-x^2) Q(t), t = 1 / (1 + x/2), for 1 <= x <= 4 (t in [1/3, 2/3])
    q = fit(lambda t: erfc(2 / t - 2) * np.exp((2 / t - 2) ** 2), 1 / 3, 2 / 3, 8)
    x = np.linspace(1, 4, 200001, dtype=np.float32)
    t = (1 / (1 + 0.5 * x)).astype(np.float32)
    y = 1 - np.exp(-(x.astype(float) ** 2)).astype(np.float32) * horner32(q, t)
    err = ulps(y.astype(np.float32), erf(x.astype(float)))
    print("erfc Q(t) =", horner_c(q, "t"), f"  [erf {err:.2f} ulp]")


if __name__ == "__main__":
    main()
