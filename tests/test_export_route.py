"""ubitrain exports a model in one trace below autograd (frontend/torch_export.py, a private
torch entry point) instead of torch's public two: `torch.export.export`, then
`run_decompositions(RECURRENT_DECOMPOSITIONS)`. Both must give one graph, node for node,
with the same signature: these models hold each kind of op the routes could treat apart
(composite ops kept whole, in-place ops, BatchNorm's buffer updates, Dropout, recurrent
unrolling, attention). A torch upgrade that parts them fails here.

Two differences are known, both without effect: a tensor constant of the model is copied
by `lift_fresh_copy` instead of `clone` (folded at compile time either way,
frontend/constants.py), and state that the graph never reads comes in module order, not
last. Fuzz models with both are judged like any other (tests/test_fuzz.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ubitrain.frontend.module_calls import checked_calls
from ubitrain.frontend.recurrent import RECURRENT_DECOMPOSITIONS, ignore_recurrent_noise
from ubitrain.frontend.torch_export import export_module


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3, inplace=True)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.bn(self.conv(x)), inplace=True), 2)
        return self.fc(self.drop(F.hardswish(y)).flatten(1))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = self.norm(x)
        y = x + self.attn(y, y, y, need_weights=False)[0]
        return self.fc(F.gelu(y).mean(1).softmax(-1))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 6, num_layers=2, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.gru(x)[0][:, -1])


class CausalAttention(Attention):
    """A boolean attn_mask: the one trace fails on the in-place masked_fill of the mask that
    nn.MultiheadAttention makes of it, and the two-trace route exports it."""

    def __init__(self):
        super().__init__()
        self.mask = torch.ones(5, 5, dtype=torch.bool).triu(1)

    def forward(self, x):
        y = self.norm(x)
        y = x + self.attn(y, y, y, attn_mask=self.mask, need_weights=False)[0]
        return self.fc(y.mean(1))


MODELS = {"conv": (ConvNet, (2, 3, 8, 8)), "attention": (Attention, (2, 5, 8)),
          "causal attention": (CausalAttention, (2, 5, 8)),
          "recurrent": (Recurrent, (2, 7, 4))}


def _public_route(model, x, training):
    model.train(training)
    with warnings.catch_warnings(), checked_calls(model):
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's, as in export_module
        ignore_recurrent_noise()
        exported = torch.export.export(model, (x,), strict=False)
        return exported.run_decompositions(RECURRENT_DECOMPOSITIONS)


def _nodes(exported):
    return [(n.op, n.name, str(n.target), str(n.args), str(n.kwargs),
             tuple(getattr(n.meta.get("val"), "shape", ())))
            for n in exported.graph.nodes]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODELS)
def test_one_trace_gives_the_public_routes_graph(name, training):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model, x = make(), torch.randn(shape)
    ours, public = export_module(model, (x,), training), _public_route(model, x, training)
    assert _nodes(ours) == _nodes(public)
    assert str(ours.graph_signature) == str(public.graph_signature)
    assert ours.state_dict.keys() == public.state_dict.keys()
