"""The ops random models are built from: the README's op table, each with its shape rule, the
Python it renders to, and a sampler of its attributes.

A shape is a tuple with the batch first. `infer` returns the output shape, or None where
PyTorch would refuse the op (a kernel larger than its padded input, a BatchNorm over one
value per channel); `layer` returns the constructor of the op's module, or of a constant
tensor attribute (None: a functional op, or no attribute for these attributes); `call` the
forward expression over its inputs' names; `sample` draws attributes for given input shapes
(None: this op does not fit them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

Shape = tuple


@dataclass(frozen=True)
class Op:
    arity: int  # tensor inputs; 0 < arity
    sample: Callable[[random.Random, list[Shape]], dict | None]
    infer: Callable[[list[Shape], dict], Shape | None]
    call: Callable[[list[str], dict, str], str]
    layer: Callable[[list[Shape], dict], str | None] | None = None  # None: no attribute


OPS: dict[str, Op] = {}


def op(name, arity=1, layer=None):
    def register(fns):
        sample, infer, call = fns()
        OPS[name] = Op(arity, sample, infer, call, layer)
        return fns
    return register


def _out(size, k, s, p, d=1, ceil=False):
    eff = (k - 1) * d + 1
    span = size + 2 * p - eff
    if span < 0:
        return None
    n = (-(-span // s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + p:  # PyTorch drops a last window that starts in padding
        n -= 1
    return n


# ---- layers with parameters --------------------------------------------------------------------
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
        n = _out(size, a["k"], a["s"], a["pad"], a["d"])
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


def _bn_layer(shapes, a):
    kind = "2d" if len(shapes[0]) == 4 else "1d"
    return (f"nn.BatchNorm{kind}({shapes[0][1]}, eps={a['eps']}, momentum={a['momentum']}, "
            f"affine={a['affine']})")


@op("batch_norm", layer=_bn_layer)
def _batch_norm():
    def sample(rng, shapes):
        return dict(eps=rng.choice([1e-5, 1e-3]), momentum=rng.choice([0.1, 0.3]),
                    affine=rng.random() < 0.85)

    def infer(shapes, a):
        shape = shapes[0]
        per_channel = math.prod(shape) // shape[1] if len(shape) > 1 else 0
        if len(shape) not in (2, 3, 4) or per_channel < 2:
            return None  # PyTorch: "Expected more than 1 value per channel when training"
        return shape
    return sample, infer, lambda xs, a, name: f"self.{name}({xs[0]})"


@op("layer_norm", layer=lambda shapes, a: f"nn.LayerNorm({list(shapes[0][-a['dims']:])}, "
                                          f"eps={a['eps']}, elementwise_affine={a['affine']})")
def _layer_norm():
    def sample(rng, shapes):
        return dict(dims=rng.choice([1, 1, 2]), eps=1e-5, affine=rng.random() < 0.8)

    def infer(shapes, a):
        return shapes[0] if len(shapes[0]) > a["dims"] else None
    return sample, infer, lambda xs, a, name: f"self.{name}({xs[0]})"


# ---- activations and Dropout ---------------------------------------------------------------
ACTIVATIONS = {
    "relu": "F.relu({})", "relu6": "F.relu6({})", "gelu": "F.gelu({})",
    "gelu_tanh": "F.gelu({}, approximate='tanh')", "silu": "F.silu({})",
    "sigmoid": "torch.sigmoid({})", "tanh": "torch.tanh({})", "hardswish": "F.hardswish({})",
    "hardsigmoid": "F.hardsigmoid({})",
}
for _name, _text in ACTIVATIONS.items():
    OPS[_name] = Op(1, lambda rng, shapes: {}, lambda shapes, a: shapes[0],
                    lambda xs, a, name, _t=_text: _t.format(xs[0]))

# Activations with an attribute: (its values, the call). The in-place forms are left to
# tests/test_ops.py: over a value another node reads, or one autograd saved, they change
# what the model computes or make PyTorch refuse the backward.
SCALED = {
    "leaky_relu": ([0.01, 0.01, 0.2, -0.5, 1.5], "F.leaky_relu({}, {})"),
    "elu": ([1.0, 1.0, 0.5, 2.0, -0.7], "F.elu({}, {})"),
}
for _name, (_values, _text) in SCALED.items():
    OPS[_name] = Op(1, lambda rng, shapes, _v=_values: dict(k=rng.choice(_v)),
                    lambda shapes, a: shapes[0],
                    lambda xs, a, name, _t=_text: _t.format(xs[0], a["k"]))


def _softmax_op(fn):
    def sample(rng, shapes):
        rank = len(shapes[0])
        return dict(dim=rng.randrange(-rank, rank))  # negative dims too; 0 mixes the batch

    def infer(shapes, a):
        return shapes[0] if -len(shapes[0]) <= a["dim"] < len(shapes[0]) else None
    return Op(1, sample, infer, lambda xs, a, name: f"{fn}({xs[0]}, dim={a['dim']})")


OPS["softmax"] = _softmax_op("F.softmax")
OPS["log_softmax"] = _softmax_op("F.log_softmax")


@op("dropout", layer=lambda shapes, a: f"nn.Dropout({a['p']})")
def _dropout():
    return (lambda rng, shapes: dict(p=rng.choice([0.1, 0.5])), lambda shapes, a: shapes[0],
            lambda xs, a, name: f"self.{name}({xs[0]})")


# ---- pooling ---------------------------------------------------------------------------------
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
    sizes = [_out(n, k, s, p, d, a["ceil"]) for n in shape[2:]]
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


# ---- reductions and shapes -------------------------------------------------------------------
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


# ---- arithmetic ------------------------------------------------------------------------------
@op("scalar")
def _scalar():
    forms = {"add": "({} + {c})", "mul": "({} * {c})", "rsub": "({c} - {})",
             "div": "({} / {c})", "neg": "(-{})"}

    def sample(rng, shapes):
        return dict(form=rng.choice(list(forms)), c=rng.choice([0.5, 1.5, 2.0, -0.75, 3.0]))
    return (sample, lambda shapes, a: shapes[0],
            lambda xs, a, name: forms[a["form"]].format(xs[0], c=a["c"]))


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out) if out[0] == max(a[0], b[0]) else None


@op("binary", arity=2)
def _binary():
    forms = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})",
             "div": "({} / ({} * {} + 1.0))"}

    def sample(rng, shapes):
        return dict(form=rng.choice(list(forms)))

    def infer(shapes, a):
        out = _broadcast(*shapes)
        return out if out is not None and out[0] == shapes[0][0] == shapes[1][0] else None

    def call(xs, a, name):
        if a["form"] == "div":
            return forms["div"].format(xs[0], xs[1], xs[1])
        return forms[a["form"]].format(*xs)
    return sample, infer, call


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


# ---- slicing and matrix products -------------------------------------------------------------
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


def _matmul_shape(a: Shape, b: Shape) -> Shape | None:
    """torch.matmul of two batched matrices: the leading axes broadcast, the batch first."""
    if len(a) < 3 or len(a) != len(b) or a[-1] != b[-2]:
        return None
    lead = _broadcast(a[:-2], b[:-2])
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


# ---- attention --------------------------------------------------------------------------------
def _attention_shapes(q: Shape, kv: Shape) -> bool:
    """Queries and keys/values of the same leading axes and features; the key length may
    differ from the query's."""
    return len(q) >= 3 and len(q) == len(kv) and q[:-2] == kv[:-2] and q[-1] == kv[-1]


def _sdpa_mask(shapes, a) -> str | None:
    """The constant mask, a plain tensor attribute (None: no mask): boolean (True: attend;
    a row may attend to nothing, which PyTorch makes zeros) or additive float."""
    if a["mask"] is None:
        return None
    rows, cols = shapes[0][-2], shapes[1][-2]
    gen = f"generator=torch.Generator().manual_seed({a['mask_seed']})"
    if a["mask"] == "bool":
        return f"torch.rand({rows}, {cols}, {gen}) < 0.7"
    return f"torch.randn({rows}, {cols}, {gen})"


@op("scaled_dot_product_attention", arity=2, layer=_sdpa_mask)
def _scaled_dot_product_attention():
    """F.scaled_dot_product_attention(q, kv, kv) over the last two axes (length, features),
    the axes before them batch and heads: causal, a constant mask or none, a scale."""
    def sample(rng, shapes):
        if not _attention_shapes(*shapes):
            return None
        mask = rng.choice([None, None, "causal", "bool", "float"])
        return dict(mask=None if mask == "causal" else mask, causal=mask == "causal",
                    mask_seed=rng.randrange(1000), scale=rng.choice([None, None, 0.3, 1.7]))

    def infer(shapes, a):
        return shapes[0] if _attention_shapes(*shapes) else None

    def call(xs, a, name):
        extra = ", is_causal=True" if a["causal"] else ""
        extra += f", attn_mask=self.{name}" if a["mask"] else ""
        extra += f", scale={a['scale']}" if a["scale"] is not None else ""
        return f"F.scaled_dot_product_attention({xs[0]}, {xs[1]}, {xs[1]}{extra})"
    return sample, infer, call


@op("multihead_attention", arity=2,
    layer=lambda shapes, a: f"nn.MultiheadAttention({shapes[0][-1]}, {a['heads']}, "
                            f"bias={a['bias']}, batch_first={a['batch_first']})")
def _multihead_attention():
    """nn.MultiheadAttention(query, kv, kv) on 3-D values; batch_first=False reads the batch
    axis as the sequence (attention across the samples, as PyTorch does)."""
    def sample(rng, shapes):
        q, kv = shapes
        if len(q) != 3 or not _attention_shapes(q, kv):
            return None
        heads = rng.choice([h for h in (1, 2, 3, 4) if q[-1] % h == 0])
        return dict(heads=heads, bias=rng.random() < 0.8, batch_first=rng.random() < 0.7,
                    need_weights=rng.random() < 0.5)

    def infer(shapes, a):
        q, kv = shapes
        if len(q) != 3 or not _attention_shapes(q, kv) or q[-1] % a["heads"]:
            return None
        return q if a["batch_first"] or q[1] == kv[1] else None

    def call(xs, a, name):
        return f"self.{name}({xs[0]}, {xs[1]}, {xs[1]}, need_weights={a['need_weights']})[0]"
    return sample, infer, call


# ---- recurrent layers --------------------------------------------------------------------------
MAX_UNROLLED_STEPS = 16  # time steps x layers x directions: the cells unrolled, compile time


def _recurrent_layer(shapes, a):
    extra = f", proj_size={a['proj']}" if a["proj"] else ""
    return (f"nn.{a['cls']}({shapes[0][2]}, {a['hidden']}, num_layers={a['layers']}, "
            f"bias={a['bias']}, batch_first={a['batch_first']}, "
            f"bidirectional={a['bidirectional']}{extra})")


@op("recurrent", layer=_recurrent_layer)
def _recurrent():
    """nn.GRU or nn.LSTM over [batch, time, features], read as the output sequence [batch,
    time, directions x hidden] or a final state [batch, layers x directions, hidden] (h, or
    an LSTM's c); time-major layers get the input transposed."""
    def sample(rng, shapes):
        if len(shapes[0]) != 3:
            return None
        cls = rng.choice(["GRU", "LSTM"])
        hidden = rng.randint(1, 6)
        reads = ["seq", "seq", "h"] + (["c"] if cls == "LSTM" else [])
        proj = rng.randint(1, hidden - 1) if cls == "LSTM" and hidden > 1 \
            and rng.random() < 0.2 else 0
        return dict(cls=cls, hidden=hidden, layers=rng.choice([1, 1, 2, 3]),
                    bias=rng.random() < 0.8, batch_first=rng.random() < 0.7,
                    bidirectional=rng.random() < 0.25, read=rng.choice(reads), proj=proj)

    def infer(shapes, a):
        shape = shapes[0]
        directions = 2 if a["bidirectional"] else 1
        if len(shape) != 3 or shape[1] * a["layers"] * directions > MAX_UNROLLED_STEPS:
            return None
        out = a["proj"] or a["hidden"]
        if a["read"] == "seq":
            return (shape[0], shape[1], directions * out)
        return (shape[0], a["layers"] * directions, a["hidden"] if a["read"] == "c" else out)

    def call(xs, a, name):
        x = xs[0] if a["batch_first"] else f"{xs[0]}.transpose(0, 1)"
        result = f"self.{name}({x})"
        if a["read"] == "seq":
            return result + ("[0]" if a["batch_first"] else "[0].transpose(0, 1)")
        state = "[1]" if a["cls"] == "GRU" else {"h": "[1][0]", "c": "[1][1]"}[a["read"]]
        return f"{result}{state}.transpose(0, 1)"
    return sample, infer, call
