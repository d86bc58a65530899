"""The fuzzer's op table: the ops random models are built from (the README's op table).
One module per concept defines each op's shape rule, the Python it renders to and a sampler
of its attributes (base.py says how); this file orders them into the table, in one place.

graphs.py draws a node's op with `rng.choices(sorted(OPS), weights)`: a seed's model
depends on the set of names and their weights, so adding any op, wherever it goes, changes
the models of existing seeds (a campaign's figures are those of one commit), while
reordering or moving ops between modules changes none. New ops go at the END of DRAW_ORDER,
whichever module defines them, so that the table reads in the order ops were added.
"""

from __future__ import annotations

from . import (  # noqa: F401 - imported to define their ops
    activations,
    arithmetic,
    attention,
    dropout,
    indexing,
    layers,
    matmul,
    norms,
    padding,
    pooling,
    recurrent,
    shapes,
    slicing,
)
from .base import DEFINED, Op, Shape

DRAW_ORDER = (
    "conv2d", "conv1d", "linear",  # layers.py
    "batch_norm", "layer_norm",  # norms.py
    *activations.ACTIVATIONS, *activations.SCALED, "softmax", "log_softmax",  # activations.py
    "dropout",  # dropout.py
    "max_pool2d", "avg_pool2d", "max_pool1d", "avg_pool1d",  # pooling.py
    "adaptive_avg_pool", "adaptive_max_pool", "global_avg_pool",
    "reduce", "flatten", "reshape", "transpose", "permute", "unsqueeze", "squeeze",  # shapes.py
    "scalar", "binary",  # arithmetic.py
    "cat",  # shapes.py
    "chunk", "narrow", "slice", "select",  # slicing.py
    "matmul", "matmul_linear",  # matmul.py
    "scaled_dot_product_attention", "multihead_attention",  # attention.py
    "recurrent",  # recurrent.py
    "index",  # indexing.py
    "dropout_inplace", "bernoulli_mask", "stochastic_depth",  # dropout.py
    "math",  # arithmetic.py
    "pad",  # padding.py
)

if set(DRAW_ORDER) != set(DEFINED) or len(DRAW_ORDER) != len(DEFINED):
    raise ImportError("tools/fuzzing/ops: DRAW_ORDER must list every defined op once; missing "
                      f"{sorted(set(DEFINED) - set(DRAW_ORDER))}, "
                      f"unknown {sorted(set(DRAW_ORDER) - set(DEFINED))}")

OPS: dict[str, Op] = {name: DEFINED[name] for name in DRAW_ORDER}

__all__ = ["OPS", "DRAW_ORDER", "Op", "Shape"]
