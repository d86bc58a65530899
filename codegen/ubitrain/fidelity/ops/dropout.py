"""Dropout in train mode: the referee replays the C runtime's masks (fidelity/dropout.py)."""

from __future__ import annotations

from .base import op


@op("dropout", layer=lambda shapes, a: f"nn.Dropout({a['p']})")
def _dropout():
    return (lambda rng, shapes: dict(p=rng.choice([0.1, 0.5])), lambda shapes, a: shapes[0],
            lambda xs, a, name: f"self.{name}({xs[0]})")

