"""Pools: max/avg over 1-D and 2-D windows, adaptive pools of any output size, global pooling."""

from __future__ import annotations

from .base import op, window_count


def _pool_sample(rng, shapes, avg, rank=4):
    if len(shapes[0]) != rank:
        return None
    k = rng.choice([1, 2, 2, 3])
    s = rng.choice([None, 1, 2, 3])
    a = dict(k=k, s=s, p=rng.randint(0, k // 2), ceil=rng.random() < 0.3)
    if avg:
        a["count_include_pad"] = rng.random() < 0.5
    else:
        a["d"] = rng.choice([1, 1, 2])
    return a


def _pool_infer(shapes, a, rank=4):
    shape = shapes[0]
    if len(shape) != rank:  # F.max_pool2d would read a 3-D input as unbatched [C, H, W]
        return None
    k, s, p, d = a["k"], a["s"] or a["k"], a["p"], a.get("d", 1)
    sizes = [window_count(n, k, s, p, d, a["ceil"]) for n in shape[2:]]
    if any(n is None or n < 1 for n in sizes):
        return None
    for size, n in zip(shape[2:], sizes):  # a window of padding only: PyTorch's max is -inf
        if any(not any(0 <= o * s - p + j * d < size for j in range(k)) for o in range(n)):
            return None
    return (*shape[:2], *sizes)


def _pool(kind: str, rank: int):
    """F.max_pool<n>d / F.avg_pool<n>d over the rank - 2 = n spatial dims."""
    avg = kind == "avg"
    tail = ("ceil_mode={ceil}, count_include_pad={count_include_pad}" if avg
            else "dilation={d}, ceil_mode={ceil}")

    def fns():
        def call(xs, a, name):
            return (f"F.{kind}_pool{rank - 2}d({xs[0]}, {a['k']}, stride={a['s']}, "
                    f"padding={a['p']}, {tail.format(**a)})")
        return (lambda rng, shapes: _pool_sample(rng, shapes, avg, rank=rank),
                lambda shapes, a: _pool_infer(shapes, a, rank=rank), call)
    return fns


for _kind, _rank in (("max", 4), ("avg", 4), ("max", 3), ("avg", 3)):
    op(f"{_kind}_pool{_rank - 2}d")(_pool(_kind, _rank))


def _adaptive_sample(rng, shapes):
    """An output size per spatial axis: a divisor of the input's (even windows), any other
    size up to one past it (uneven, overlapping or repeated windows), or None (keep it)."""
    rank = len(shapes[0])
    if rank not in (3, 4):
        return None
    out = []
    for size in shapes[0][2:]:
        kind = rng.choice(["divisor", "any", "any"] + (["none"] if rank == 4 else []))
        if kind == "divisor":
            out.append(rng.choice([d for d in range(1, size + 1) if size % d == 0]))
        else:
            out.append(None if kind == "none" else rng.randint(1, size + 1))
    return dict(out=out)


def _adaptive_infer(shapes, a):
    shape = shapes[0]
    if len(shape) != 2 + len(a["out"]):
        return None
    return (*shape[:2], *(n if o is None else o for n, o in zip(shape[2:], a["out"])))


def _adaptive_call(fn):
    def call(xs, a, name):
        dims = len(a["out"])
        out = a["out"][0] if dims == 1 else tuple(a["out"])
        return f"F.adaptive_{fn}_pool{dims}d({xs[0]}, {out})"
    return call


@op("adaptive_avg_pool")
def _adaptive_avg_pool():
    return _adaptive_sample, _adaptive_infer, _adaptive_call("avg")


@op("adaptive_max_pool")
def _adaptive_max_pool():
    return _adaptive_sample, _adaptive_infer, _adaptive_call("max")


@op("global_avg_pool")
def _global_avg_pool():
    return (lambda rng, shapes: {} if len(shapes[0]) == 4 else None,
            lambda shapes, a: (*shapes[0][:2], 1, 1) if len(shapes[0]) == 4 else None,
            lambda xs, a, name: f"F.adaptive_avg_pool2d({xs[0]}, 1)")

