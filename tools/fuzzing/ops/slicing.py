"""Slicing along a non-batch axis: chunk, narrow, basic slices and select."""

from __future__ import annotations

from .base import op


def _axis(rng, shape, least=2):
    """A non-batch axis with at least `least` elements, or None."""
    dims = [d for d in range(1, len(shape)) if shape[d] >= least]
    return rng.choice(dims) if dims else None


@op("chunk")
def _chunk():
    """One part of `x.chunk(n, d)`, or every part: a GLU-like gate (`a * sigmoid(b)`), or the
    parts concatenated in reverse order."""
    def sample(rng, shapes):
        d = _axis(rng, shapes[0])
        if d is None:
            return None
        form = rng.choice(["part", "part", "gate", "reverse"])
        n = 2 if form == "gate" else rng.choice([2, 3])
        return dict(d=d, n=n, form=form, part=rng.randrange(n) if form == "part" else 0)

    def infer(shapes, a):
        shape = list(shapes[0])
        d, size = a["d"], shape[a["d"]] if a["d"] < len(shapes[0]) else 0
        step = -(-size // a["n"])  # torch.chunk: parts of ceil(size / n), maybe fewer parts
        parts = [min(step, size - s) for s in range(0, size, step)] if size else []
        if a["form"] == "reverse":
            return tuple(shape) if len(parts) > 1 else None
        if a["form"] == "gate":
            return tuple(shape[:d] + [parts[0]] + shape[d + 1:]) if size % 2 == 0 else None
        return tuple(shape[:d] + [parts[a["part"]]] + shape[d + 1:]) \
            if a["part"] < len(parts) else None

    def call(xs, a, name):
        x, d, n = xs[0], a["d"], a["n"]
        if a["form"] == "gate":
            return f"({x}.chunk(2, {d})[0] * torch.sigmoid({x}.chunk(2, {d})[1]))"
        if a["form"] == "reverse":
            return f"torch.cat({x}.chunk({n}, {d})[::-1], {d})"
        return f"{x}.chunk({n}, {d})[{a['part']}]"
    return sample, infer, call


@op("narrow")
def _narrow():
    def sample(rng, shapes):
        d = _axis(rng, shapes[0])
        if d is None:
            return None
        size = shapes[0][d]
        length = rng.randint(1, size - 1)
        start = rng.randint(0, size - length)
        return dict(d=d, start=start - size if rng.random() < 0.3 else start, length=length)

    def infer(shapes, a):
        shape = list(shapes[0])
        if a["d"] >= len(shape) or not -shape[a["d"]] <= a["start"] < shape[a["d"]] \
                or a["start"] % shape[a["d"]] + a["length"] > shape[a["d"]]:
            return None
        shape[a["d"]] = a["length"]
        return tuple(shape)
    return (sample, infer,
            lambda xs, a, name: f"{xs[0]}.narrow({a['d']}, {a['start']}, {a['length']})")


@op("slice")
def _slice():
    """`x[:, ..., start:stop:step]` along a non-batch axis, with negative bounds too."""
    def sample(rng, shapes):
        d = _axis(rng, shapes[0])
        if d is None:
            return None
        size = shapes[0][d]
        start, stop = rng.randint(-size, size - 1), rng.choice([None, rng.randint(-size, size)])
        return dict(d=d, start=start, stop=stop, step=rng.choice([1, 1, 2, 3]))

    def infer(shapes, a):
        shape = list(shapes[0])
        if a["d"] >= len(shape):
            return None
        shape[a["d"]] = len(range(shape[a["d"]])[a["start"]:a["stop"]:a["step"]])
        return tuple(shape) if shape[a["d"]] else None

    def call(xs, a, name):
        stop = "" if a["stop"] is None else a["stop"]
        return f"{xs[0]}[{':, ' * a['d']}{a['start']}:{stop}:{a['step']}]"
    return sample, infer, call


@op("select")
def _select():
    """`x[:, i]` along a non-batch axis: the rank drops by one (at least two remain)."""
    def sample(rng, shapes):
        d = _axis(rng, shapes[0], least=1)
        if d is None or len(shapes[0]) < 3:
            return None
        return dict(d=d, i=rng.randint(-shapes[0][d], shapes[0][d] - 1))

    def infer(shapes, a):
        shape = list(shapes[0])
        if len(shape) < 3 or a["d"] >= len(shape) or not -shape[a["d"]] <= a["i"] < shape[a["d"]]:
            return None
        return tuple(shape[:a["d"]] + shape[a["d"] + 1:])
    return sample, infer, lambda xs, a, name: f"{xs[0]}.select({a['d']}, {a['i']})"

