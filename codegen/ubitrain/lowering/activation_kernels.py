"""TE kernels of the fused elementwise activations (training/elu.py)."""

from __future__ import annotations

from tvm import te, tirx


def elu(x, alpha: float, scale: float, input_scale: float, acc: str):
    """y = x > 0 ? scale x : alpha scale expm1(input_scale x). TIR has no expm1; the identity
    expm1(z) = tanh(z / 2) (exp(z) + 1) keeps its relative precision near 0, where
    exp(z) - 1 cancels. z is held to <= 0 so that the side not taken cannot overflow."""

    def c(k):
        return tirx.const(k, x.dtype)

    def f(*i):
        z = tirx.min(x(*i), c(0.0)) * c(input_scale)
        expm1 = tirx.tanh(z * c(0.5)) * (tirx.exp(z) + c(1.0))
        return tirx.Select(x(*i) > c(0.0), x(*i) * c(scale), expm1 * c(alpha * scale))

    return te.compute(x.shape, f, name="elu")


def elu_backward(x, dy, alpha: float, scale: float, input_scale: float, acc: str):
    """PyTorch's elu_backward from x: the negative side's slope at exactly 0."""

    def c(k):
        return tirx.const(k, x.dtype)

    def f(*i):
        slope = tirx.exp(tirx.min(x(*i), c(0.0)) * c(input_scale)) * c(alpha * scale * input_scale)
        return dy(*i) * tirx.Select(x(*i) > c(0.0), c(scale), slope)

    return te.compute(x.shape, f, name="elu_backward")
