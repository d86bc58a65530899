"""Layers with weights: Conv1d/Conv2d (plain, depthwise, grouped; padding 'same' too) and Linear."""

from __future__ import annotations

from .base import op, window_count


def _conv_layer(dims):
    def layer(shapes, a):
        cls = f"nn.Conv{dims}d"
        pad = repr(a["pad"]) if isinstance(a["pad"], str) else a["pad"]
        return (f"{cls}({shapes[0][1]}, {a['out']}, {a['k']}, stride={a['s']}, padding={pad}, "
                f"dilation={a['d']}, groups={a['g']}, bias={a['bias']})")
    return layer


def _conv_sample(rank):
    def sample(rng, shapes):
        (shape,) = shapes
        if len(shape) != rank:
            return None
        c = shape[1]
        kind = rng.choice(["plain", "plain", "depthwise", "grouped"])
        if kind == "depthwise":
            g, out = c, c * rng.choice([1, 1, 2])
        elif kind == "grouped" and c > 1:
            g = rng.choice([d for d in range(2, c + 1) if c % d == 0])
            out = g * rng.randint(1, 3)
        else:
            g, out = 1, rng.randint(1, 8)
        k, s, d = rng.choice([1, 1, 2, 3, 3, 5]), rng.choice([1, 1, 1, 2, 3]), rng.choice([1, 1, 2])
        pad = rng.choice([0, 0, 1, 2, "same"] if s == 1 else [0, 0, 1, 2])  # same: stride 1
        return dict(out=out, k=k, s=s, pad=pad, d=d, g=g, bias=rng.random() < 0.7)
    return sample


def _conv_infer(shapes, a):
    shape = shapes[0]
    if shape[1] % a["g"] or a["out"] % a["g"]:
        return None
    sizes = []
    for size in shape[2:]:
        if a["pad"] == "same":
            sizes.append(size)
            continue
        n = window_count(size, a["k"], a["s"], a["pad"], a["d"])
        if n is None or n < 1:
            return None
        sizes.append(n)
    return (shape[0], a["out"], *sizes)


@op("conv2d", layer=_conv_layer(2))
def _conv2d():
    return _conv_sample(4), _conv_infer, lambda xs, a, name: f"self.{name}({xs[0]})"


@op("conv1d", layer=_conv_layer(1))
def _conv1d():
    return _conv_sample(3), _conv_infer, lambda xs, a, name: f"self.{name}({xs[0]})"


@op("linear", layer=lambda shapes, a: f"nn.Linear({shapes[0][-1]}, {a['out']}, bias={a['bias']})")
def _linear():
    def sample(rng, shapes):
        return dict(out=rng.randint(1, 12), bias=rng.random() < 0.8)
    return (sample, lambda shapes, a: (*shapes[0][:-1], a["out"]),
            lambda xs, a, name: f"self.{name}({xs[0]})")

