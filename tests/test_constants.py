"""Compile-time constants (frontend/constants.py): what depends only on shapes, constants and
the non-float buffers the step never writes is computed by torch at compile time, and
nothing else is. The folded graphs are checked node by node against torch; the models that
need the folding train like PyTorch (the referee); a data-dependent comparison is refused by
name."""

import pytest
import torch
import torch.nn.functional as F
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub
from ubitrain.frontend.aten import ATEN_CONVERTERS
from ubitrain.frontend.constants import fold_constants
from ubitrain.frontend.torch_export import export_module

aten = torch.ops.aten
CLASSES = 3


class PositionMask(nn.Module):
    """What BERT's embeddings and mask do: position and token-type ids from int64 buffers
    (sliced, gathered by position, expanded to the batch), and a boolean attention mask
    from a comparison of `arange` positions (causal, as GPT-2's)."""

    def __init__(self, length=6, features=8):
        super().__init__()
        self.register_buffer("position_ids", torch.arange(16).expand(1, -1), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, 16, dtype=torch.long))
        self.tokens = nn.Embedding(20, features)
        self.positions = nn.Embedding(16, features)
        self.types = nn.Embedding(2, features)
        self.fc = nn.Linear(features * length, CLASSES)

    def forward(self, ids):
        batch, length = ids.shape
        positions = self.position_ids[:, :length]
        types = torch.gather(self.token_type_ids.expand(1, -1), 1, positions)
        x = self.tokens(ids) + self.types(types.expand(batch, length)) \
            + self.positions(positions)
        rows = torch.arange(length)
        causal = (rows[None, :] <= rows[:, None]) & (rows[:, None] >= 0)
        mask = causal[None, None].expand(batch, 1, length, length)
        x = F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], attn_mask=mask)
        return self.fc(x.flatten(1))


def _ids(batch, length=6, steps=3):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 20, (batch, length), generator=gen),
             torch.randint(0, CLASSES, (batch,), generator=gen)) for _ in range(steps)]


def _folded(model, x):
    exported = export_module(model, (x,), True)
    folded = fold_constants(exported, lambda node: node.target in ATEN_CONVERTERS)
    return exported, folded


def test_masks_and_position_ids_are_folded_to_their_torch_values():
    model = PositionMask()
    x = torch.randint(0, 20, (2, 6))
    _, folded = _folded(model, x)
    by_target = {}
    for node, value in folded.items():
        by_target.setdefault(node.target, []).append(value)
    # the ops without a kernel are computed at compile time, as torch computes them
    for target in (aten.gather.default, aten.le.Tensor, aten.ge.Scalar,
                   aten.__and__.Tensor):
        assert target in by_target, f"{target} not folded: {sorted(map(str, by_target))}"
    assert torch.equal(by_target[aten.gather.default][0], torch.zeros(1, 6, dtype=torch.long))
    masks = [v for v in folded.values() if v.dtype == torch.bool and v.shape == (2, 1, 6, 6)]
    assert len(masks) == 1 and torch.equal(masks[0][1, 0], torch.ones(6, 6).tril().bool())
    # nothing that reads the input, a parameter or the embeddings is folded
    for node in folded:
        assert node.target is not aten.embedding.default
        assert node.target is not aten.scaled_dot_product_attention.default


@pytest.mark.parametrize("batch", [1, 4])
def test_position_mask_model_trains_like_pytorch(batch, tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(PositionMask(), _ids(batch), ub.SGD(lr=0.1, momentum=0.9),
                             tmp_path)


class Compare(nn.Module):
    """A comparison of the input: data dependent, never a constant."""

    def forward(self, x):
        return torch.where(x > 0, x, 0.0).sum(1)


def test_a_data_dependent_comparison_is_not_folded():
    _, folded = _folded(Compare(), torch.randn(2, 4, CLASSES))
    assert not folded


class WrittenCounter(nn.Module):
    """An int64 buffer the step writes (a step counter) is state, not a constant: what reads
    it is not folded."""

    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.ones(CLASSES))  # a float buffer: state
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        self.steps.add_(1)
        return self.fc(x) * (self.steps * 0 + 1) * (self.scale * 2)


class FilledZeros(nn.Module):
    """A creation op that feeds the model's own ops stays a fill kernel: not folded."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(x) + torch.zeros(CLASSES).unsqueeze(0)


@pytest.mark.parametrize("make", [WrittenCounter, FilledZeros],
                         ids=["written_and_float_buffers", "fill_feeding_a_kernel"])
def test_state_and_fills_that_feed_kernels_are_not_folded(make):
    _, folded = _folded(make(), torch.randn(2, 4))
    assert not folded


class InputMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(x.masked_fill(x > 0.5, 0.0))


def test_a_data_dependent_comparison_is_refused_by_name(tmp_path):
    with pytest.raises(ub.UnsupportedOpError, match=r"<top>: aten.gt.Scalar is not supported"):
        ub.compile(InputMask(), (torch.randn(2, 4),), torch.zeros(2, dtype=torch.long),
                   out_dir=tmp_path)


class IntBufferMask(nn.Module):
    """An int64 0/1 buffer the step never writes, made a bool attention mask: a constant."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(5, 5, dtype=torch.long).tril())
        self.fc = nn.Linear(4, CLASSES)

    def forward(self, x):
        mask = self.mask.bool()
        return self.fc(F.scaled_dot_product_attention(x, x, x, attn_mask=mask).sum(1))


def test_an_int_buffer_mask_trains_like_pytorch(tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(IntBufferMask(), batches((2, 5, 4), CLASSES),
                             ub.SGD(lr=0.1), tmp_path)
