"""Arithmetic: a value with a scalar, and two values that broadcast together."""

from __future__ import annotations

from .base import broadcast, op


@op("scalar")
def _scalar():
    forms = {"add": "({} + {c})", "mul": "({} * {c})", "rsub": "({c} - {})",
             "div": "({} / {c})", "neg": "(-{})"}

    def sample(rng, shapes):
        return dict(form=rng.choice(list(forms)), c=rng.choice([0.5, 1.5, 2.0, -0.75, 3.0]))
    return (sample, lambda shapes, a: shapes[0],
            lambda xs, a, name: forms[a["form"]].format(xs[0], c=a["c"]))


@op("binary", arity=2)
def _binary():
    forms = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})",
             "div": "({} / ({} * {} + 1.0))"}

    def sample(rng, shapes):
        return dict(form=rng.choice(list(forms)))

    def infer(shapes, a):
        out = broadcast(*shapes)
        return out if out is not None and out[0] == shapes[0][0] == shapes[1][0] else None

    def call(xs, a, name):
        if a["form"] == "div":
            return forms["div"].format(xs[0], xs[1], xs[1])
        return forms[a["form"]].format(*xs)
    return sample, infer, call

