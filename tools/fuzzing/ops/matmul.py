"""Matrix products over the last two axes: a @ b^T, a^T @ b, and x^T @ linear(x)."""

from __future__ import annotations

from .base import Shape, broadcast, op


def _matmul_shape(a: Shape, b: Shape) -> Shape | None:
    """torch.matmul of two batched matrices: the leading axes broadcast, the batch first."""
    if len(a) < 3 or len(a) != len(b) or a[-1] != b[-2]:
        return None
    lead = broadcast(a[:-2], b[:-2])
    return None if lead is None else (*lead, a[-2], b[-1])


def _t(shape: Shape) -> Shape:
    return (*shape[:-2], shape[-1], shape[-2])


@op("matmul", arity=2)
def _matmul():
    """`a @ b^T` (attention scores; `x @ x^T` where both are one value) or `a^T @ b`, over
    the last two axes, per sample."""
    def sample(rng, shapes):
        return dict(form=rng.choice(["nt", "tn"])) if len(shapes[0]) >= 3 else None

    def infer(shapes, a):
        x, y = shapes
        out = _matmul_shape(x, _t(y)) if a["form"] == "nt" else _matmul_shape(_t(x), y)
        return out if out is not None and out[0] == x[0] == y[0] else None

    def call(xs, a, name):
        if a["form"] == "nt":
            return f"({xs[0]} @ {xs[1]}.transpose(-1, -2))"
        return f"({xs[0]}.transpose(-1, -2) @ {xs[1]})"
    return sample, infer, call


@op("matmul_linear", layer=lambda shapes, a: f"nn.Linear({shapes[0][-1]}, {a['out']}, "
                                               f"bias={a['bias']})")
def _matmul_linear():
    """`x^T @ linear(x)`: both operands of the product depend on parameters."""
    def sample(rng, shapes):
        if len(shapes[0]) < 3:
            return None
        return dict(out=rng.randint(1, 8), bias=rng.random() < 0.5)

    def infer(shapes, a):
        x = shapes[0]
        return _matmul_shape(_t(x), (*x[:-1], a["out"])) if len(x) >= 3 else None
    return (sample, infer,
            lambda xs, a, name: f"({xs[0]}.transpose(-1, -2) @ self.{name}({xs[0]}))")

