"""Normalization layers: BatchNorm1d/2d and LayerNorm over the last one or two axes."""

from __future__ import annotations

import math

from .base import op


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

