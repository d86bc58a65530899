"""Recurrent layers: nn.GRU and nn.LSTM, unrolled by the compiler."""

from __future__ import annotations

from .base import op

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
