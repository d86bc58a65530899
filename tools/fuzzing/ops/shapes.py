"""Reductions and shape ops: mean/sum, flatten, reshape, transpose, permute, (un)squeeze, cat."""

from __future__ import annotations

import math

from .base import op


@op("reduce")
def _reduce():
    def sample(rng, shapes):
        rank = len(shapes[0])
        if rank < 2:
            return None
        dims = sorted(rng.sample(range(1, rank), rng.randint(1, rank - 1)))
        return dict(fn=rng.choice(["mean", "sum"]), dims=dims, keep=rng.random() < 0.5)

    def infer(shapes, a):
        shape = shapes[0]
        if any(d >= len(shape) for d in a["dims"]):
            return None
        if a["keep"]:
            return tuple(1 if i in a["dims"] else n for i, n in enumerate(shape))
        out = tuple(n for i, n in enumerate(shape) if i not in a["dims"])
        return out if len(out) >= 2 else None  # every value keeps the batch and a feature dim
    return (sample, infer,
            lambda xs, a, name: f"{xs[0]}.{a['fn']}({tuple(a['dims'])}, keepdim={a['keep']})")


@op("flatten")
def _flatten():
    return (lambda rng, shapes: {} if len(shapes[0]) > 2 else None,
            lambda shapes, a: (shapes[0][0], math.prod(shapes[0][1:])),
            lambda xs, a, name: f"{xs[0]}.flatten(1)")


@op("reshape")
def _reshape():
    def sample(rng, shapes):
        n = math.prod(shapes[0][1:])
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        first = rng.choice(divisors)
        rest = n // first
        if rng.random() < 0.5:
            return dict(shape=[first, rest])
        second = rng.choice([d for d in range(1, rest + 1) if rest % d == 0])
        return dict(shape=[first, second, rest // second])

    def infer(shapes, a):
        if math.prod(a["shape"]) != math.prod(shapes[0][1:]):
            return None
        return (shapes[0][0], *a["shape"])
    return (sample, infer,
            lambda xs, a, name: f"{xs[0]}.reshape({xs[0]}.shape[0], "
                                f"{', '.join(map(str, a['shape']))})")


@op("transpose")
def _transpose():
    def sample(rng, shapes):
        rank = len(shapes[0])
        if rank < 3:
            return None
        return dict(dims=sorted(rng.sample(range(1, rank), 2)))

    def infer(shapes, a):
        shape = list(shapes[0])
        i, j = a["dims"]
        if j >= len(shape):
            return None
        shape[i], shape[j] = shape[j], shape[i]
        return tuple(shape)
    return sample, infer, lambda xs, a, name: f"{xs[0]}.transpose({a['dims'][0]}, {a['dims'][1]})"


@op("permute")
def _permute():
    def sample(rng, shapes):
        rank = len(shapes[0])
        if rank < 3:
            return None
        rest = list(range(1, rank))
        rng.shuffle(rest)
        return dict(order=[0] + rest)

    def infer(shapes, a):
        if len(a["order"]) != len(shapes[0]):
            return None
        return tuple(shapes[0][i] for i in a["order"])
    return sample, infer, lambda xs, a, name: f"{xs[0]}.permute({', '.join(map(str, a['order']))})"


@op("unsqueeze")
def _unsqueeze():
    def infer(shapes, a):
        shape = list(shapes[0])
        if len(shape) >= 4 or a["dim"] > len(shape):
            return None
        return tuple(shape[:a["dim"]] + [1] + shape[a["dim"]:])
    return (lambda rng, shapes: dict(dim=rng.randint(1, len(shapes[0]))), infer,
            lambda xs, a, name: f"{xs[0]}.unsqueeze({a['dim']})")


@op("squeeze")
def _squeeze():
    def sample(rng, shapes):
        ones = [i for i, n in enumerate(shapes[0]) if n == 1 and i > 0]
        return dict(dim=rng.choice(ones)) if ones and len(shapes[0]) > 2 else None

    def infer(shapes, a):
        shape = shapes[0]
        if a["dim"] >= len(shape) or shape[a["dim"]] != 1 or len(shape) <= 2:
            return None
        return tuple(n for i, n in enumerate(shape) if i != a["dim"])
    return sample, infer, lambda xs, a, name: f"{xs[0]}.squeeze({a['dim']})"


@op("cat", arity=2)
def _cat():
    def sample(rng, shapes):
        return dict(dim=rng.randint(1, len(shapes[0]) - 1)) if len(shapes[0]) > 1 else None

    def infer(shapes, a):
        x, y = shapes
        d = a["dim"]
        if len(x) != len(y) or d >= len(x) or any(
                p != q for i, (p, q) in enumerate(zip(x, y)) if i != d):
            return None
        return tuple(p + q if i == d else p for i, (p, q) in enumerate(zip(x, y)))
    return sample, infer, lambda xs, a, name: f"torch.cat([{xs[0]}, {xs[1]}], {a['dim']})"

