"""Activations (plain, with a drawn slope or alpha), Softmax and LogSoftmax over a drawn axis."""

from __future__ import annotations

from .base import Op, define

ACTIVATIONS = {
    "relu": "F.relu({})", "relu6": "F.relu6({})", "gelu": "F.gelu({})",
    "gelu_tanh": "F.gelu({}, approximate='tanh')", "silu": "F.silu({})",
    "sigmoid": "torch.sigmoid({})", "tanh": "torch.tanh({})", "hardswish": "F.hardswish({})",
    "hardsigmoid": "F.hardsigmoid({})",
}
for _name, _text in ACTIVATIONS.items():
    define(_name, Op(1, lambda rng, shapes: {}, lambda shapes, a: shapes[0],
                     lambda xs, a, name, _t=_text: _t.format(xs[0])))

# Activations with an attribute: (its values, the call). The in-place forms are left to
# tests/test_ops_activations.py: over a value another node reads, or one autograd saved,
# they change what the model computes or make PyTorch refuse the backward.
SCALED = {
    "leaky_relu": ([0.01, 0.01, 0.2, -0.5, 1.5], "F.leaky_relu({}, {})"),
    "elu": ([1.0, 1.0, 0.5, 2.0, -0.7], "F.elu({}, {})"),
}
for _name, (_values, _text) in SCALED.items():
    define(_name, Op(1, lambda rng, shapes, _v=_values: dict(k=rng.choice(_v)),
                     lambda shapes, a: shapes[0],
                     lambda xs, a, name, _t=_text: _t.format(xs[0], a["k"])))


def _softmax_op(fn):
    def sample(rng, shapes):
        rank = len(shapes[0])
        return dict(dim=rng.randrange(-rank, rank))  # negative dims too; 0 mixes the batch

    def infer(shapes, a):
        return shapes[0] if -len(shapes[0]) <= a["dim"] < len(shapes[0]) else None
    return Op(1, sample, infer, lambda xs, a, name: f"{fn}({xs[0]}, dim={a['dim']})")


define("softmax", _softmax_op("F.softmax"))
define("log_softmax", _softmax_op("F.log_softmax"))
