"""Optimizers with PyTorch's exact update formulas.

Each optimizer gives
- the per-parameter state tensors it keeps (momentum buffer, Adam moments),
- C code that computes a few per-step coefficients from the 1-based step counter in double
  precision, as PyTorch does in Python (bias corrections, first-step momentum), and
- a TE compute for the elementwise update, which reads a parameter, its gradient, its state
  and the coefficients, and writes the new parameter and state. Every element reads only its
  own index before writing it, so the step program runs it in place.

`clip_grad_norm=max_norm` clips the gradients by their global L2 norm first, with
torch.nn.utils.clip_grad_norm_'s rule: the step computes the norm over every trained
gradient (program/gradient_clipping.py) and writes min(max_norm / (norm + 1e-6), 1) as one
more coefficient, by which the update multiplies the gradient before anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from .errors import CompileError


def _check(name, value, low=0.0, high=None, strict_low=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CompileError(f"optimizer parameter {name}={value!r} must be a number, not "
                           f"{type(value).__name__}")
    bad = (value != value or value < low or (strict_low and value == low)  # NaN: out of range
           or (high is not None and value >= high))
    if bad:
        bound = f"> {low}" if strict_low else f">= {low}"
        raise CompileError(f"optimizer parameter {name}={value} is out of range; it must be "
                           f"{bound}" + (f" and < {high}" if high is not None else ""))


def _check_clip(value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise CompileError(f"optimizer parameter clip_grad_norm={value!r} must be a finite "
                           "number > 0 (the largest global L2 norm of the gradients), or None "
                           "not to clip")


def _clipped(grad, coef, max_norm):
    """The gradient times the clipping coefficient, the one after the optimizer's own."""
    if max_norm is None:
        return grad
    return grad * coef[int(coef.shape[0]) - 1]


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD: momentum, dampening, nesterov and (L2) weight decay."""

    lr: float = 0.01
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    clip_grad_norm: float | None = None

    def __post_init__(self):
        _check_clip(self.clip_grad_norm)
        _check("lr", self.lr)
        _check("momentum", self.momentum)
        _check("dampening", self.dampening)
        _check("weight_decay", self.weight_decay)
        if not isinstance(self.nesterov, bool):
            raise CompileError(f"SGD(nesterov={self.nesterov!r}) must be True or False")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise CompileError("SGD(nesterov=True) needs momentum > 0 and dampening = 0, "
                               "as in PyTorch")

    state_names = property(lambda self: ("momentum_buffer",) if self.momentum else ())

    def coefficient_code(self) -> list[str]:
        # PyTorch initialises the momentum buffer to the first gradient (no dampening).
        return [
            f"(float){self.lr!r}",
            f"step == 1 ? 0.0f : (float){self.momentum!r}",
            f"step == 1 ? 1.0f : (float){1.0 - self.dampening!r}",
        ]

    def update(self, param, grad, states, coef):
        wd, mom, nesterov = self.weight_decay, self.momentum, self.nesterov

        def rule(*i):
            p, g = param(*i), _clipped(grad(*i), coef, self.clip_grad_norm)
            if wd:
                g = g + tirx.const(wd, "float32") * p
            if not mom:
                return [p + (-coef[0]) * g]
            buf = coef[1] * states[0](*i) + coef[2] * g
            step = g + tirx.const(mom, "float32") * buf if nesterov else buf
            return [p + (-coef[0]) * step, buf]

        return te.compute(param.shape, rule, name="sgd_update")


@dataclass(frozen=True)
class Adam:
    """torch.optim.Adam (L2 weight decay added to the gradient), amsgrad=False."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    decoupled = False

    def __post_init__(self):
        _check_clip(self.clip_grad_norm)
        _check("lr", self.lr)
        _check("eps", self.eps)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise CompileError(f"optimizer parameter betas={self.betas!r} must be a pair "
                               "(beta1, beta2), e.g. (0.9, 0.999)")
        _check("betas[0]", self.betas[0], high=1.0)
        _check("betas[1]", self.betas[1], high=1.0)
        _check("weight_decay", self.weight_decay)

    state_names = ("exp_avg", "exp_avg_sq")

    def coefficient_code(self) -> list[str]:
        b1, b2 = self.betas
        return [
            f"(float)({self.lr!r} / (1.0 - pow({b1!r}, (double)step)))",  # step size
            f"(float)sqrt(1.0 - pow({b2!r}, (double)step))",  # sqrt of bias correction 2
            f"(float)(1.0 - {self.lr!r} * {self.weight_decay!r})",  # AdamW's decay factor
        ]

    def update(self, param, grad, states, coef):
        b1, b2 = self.betas
        f32 = lambda v: tirx.const(v, "float32")  # noqa: E731
        weight = 1.0 - b1

        def rule(*i):
            p, g, m, v = param(*i), grad(*i), states[0](*i), states[1](*i)
            g = _clipped(g, coef, self.clip_grad_norm)
            if self.weight_decay and self.decoupled:
                p = p * coef[2]
            elif self.weight_decay:
                g = g + f32(self.weight_decay) * p
            # torch.lerp(m, g, w) switches formula at w = 0.5 for accuracy; so do we.
            m = m + f32(weight) * (g - m) if weight < 0.5 else g - (g - m) * f32(1.0 - weight)
            v = v * f32(b2) + f32(1.0 - b2) * g * g
            denom = tirx.sqrt(v) / coef[1] + f32(self.eps)
            return [p + (-coef[0]) * (m / denom), m, v]

        return te.compute(param.shape, rule, name="adam_update")


@dataclass(frozen=True)
class AdamW(Adam):
    """torch.optim.AdamW: weight decay applied to the parameter, decoupled from the gradient."""

    weight_decay: float = 1e-2
    decoupled = True


OPTIMIZERS = (SGD, Adam, AdamW)
