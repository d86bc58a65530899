"""Indexing by a constant tensor (`x[:, idx]`, `x[..., idx]`, `torch.index_select`, `x[:, i, j]`
on adjacent dimensions) trains
as PyTorch's autograd does: judged step by step against PyTorch in float64
(harness.assert_trains_like_torch). The gradient is a scatter-add, so repeated indices sum."""

import pytest
import torch
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub


class Gathers(nn.Module):
    """Repeated and negative indices, on activations and on a parameter's rows."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.rows = nn.Parameter(torch.randn(4, 12) * 0.3)
        self.cols = torch.tensor([2, 0, 2, 7, -1, 2])  # a plain tensor attribute: a constant

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        a = h[:, self.cols]
        b = torch.index_select(h, 1, torch.tensor([1, 1, 3, 0, 5, 1]))
        w = self.rows[torch.tensor([3, 1, 3, 3, 0])]  # [5, 12]: row 3 used three times
        return torch.cat([a, b], 1) @ w.t()


class ChannelGathers(nn.Module):
    """On a conv feature map: channels by index_select, a 2-D index on the last axis."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(3 * 2 * 3 * 5, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x))  # [N, 4, 5, 6]
        h = torch.index_select(h, 1, torch.tensor([3, 0, 3]))  # [N, 3, 5, 6]
        h = h[..., torch.tensor([[5, 0, 5], [1, 1, 2]])]  # [N, 3, 5, 2, 3]
        return self.fc(h.flatten(1))


@pytest.mark.parametrize("batch", [1, 8])
def test_constant_index_trains_like_pytorch(batch, tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(Gathers(), batches((batch, 6), 5, seed=batch),
                             ub.SGD(lr=0.1, momentum=0.9), tmp_path)


def test_constant_index_on_feature_maps_trains_like_pytorch(tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(ChannelGathers(), batches((4, 2, 5, 6), 5, seed=4),
                             ub.SGD(lr=0.1, momentum=0.9), tmp_path)


class PairGathers(nn.Module):
    """`h[:, i, j]`: two index tensors broadcast together ([3, 1] and [1, 3]), repeated and
    negative indices, the result in place of the two dimensions."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 12)
        self.out = nn.Linear(9, 5)

    def forward(self, x):
        h = torch.tanh(self.fc(x)).reshape(-1, 3, 4)
        g = h[:, torch.tensor([[0], [2], [2]]), torch.tensor([[1, -1, 1]])]  # [N, 3, 3]
        return self.out(g.flatten(1))


def test_two_adjacent_index_tensors_train_like_pytorch(tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(PairGathers(), batches((4, 6), 5, seed=5),
                             ub.SGD(lr=0.1, momentum=0.9), tmp_path)


class IndexedBy(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc, self.kind = nn.Linear(6, 8), kind
        self.register_buffer("idx", torch.tensor([1, 2]))

    def forward(self, x, ids=None):
        h = self.fc(x)
        if self.kind == "input":
            return h[:, ids]
        if self.kind == "buffer":
            return torch.index_select(h, 1, self.idx)
        if self.kind == "two":
            return h.reshape(-1, 2, 2, 2)[:, torch.tensor([0, 1]), :, torch.tensor([1, 0])]
        return torch.index_select(h, 1, torch.tensor([3, 8]))  # "range"


@pytest.mark.parametrize("kind,message", [
    ("input", "index computed inside the model or taken from its inputs"),
    ("buffer", "not a registered buffer"),
    ("two", "index tensors on dimensions that are not adjacent"),
    ("range", r"indices from 3 to 8 on a dimension of size 8 .*use indices in \[0, 8\)"),
])
def test_unsupported_indices_are_named(kind, message, tmp_path):
    x = torch.randn(4, 6)
    inputs = (x, torch.tensor([0, 1])) if kind == "input" else (x,)
    with pytest.raises(ub.UnsupportedOpError, match=message):
        ub.compile(IndexedBy(kind), inputs, torch.randint(0, 2, (4,)), out_dir=tmp_path)
