"""Layout and slicing ops (reshape, permute, expand, flip, chunk, split, slices, select,
roll): the generated C against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import pytest
import torch
from op_harness import Fn, WithParam, check, randn


@pytest.mark.parametrize("fn,wshape", [
    (lambda x, w: torch.flatten(x, 1) * w, (60,)),
    (lambda x, w: x.reshape(2, -1, 4) * w, (15, 4)),
    (lambda x, w: x.view(6, 20).sum(dim=0) * w, (20,)),
    (lambda x, w: x.permute(0, 2, 3, 1) * w, (4, 5, 3)),
    (lambda x, w: x.transpose(1, 2).flatten(2) * w, (4, 15)),
    (lambda x, w: x.transpose(-1, 0).reshape(-1) * w, (120,)),
    (lambda x, w: x.flatten().unsqueeze(0).squeeze(0)[None] * w + x.view(1, -1), (120,)),
    (lambda x, w: x.reshape(6, 20).t() * w, (20, 6)),
    (lambda x, w: x[:, :1].expand(-1, 3, -1, -1) * w, (4, 5)),
    (lambda x, w: x * w.expand(2, 3, 4, 5), (4, 1)),  # new leading dims: a class token
    (lambda x, w: x.flip(1) * w, (3, 4, 5)),
    (lambda x, w: x.flip([0, -1]) * w, (3, 4, 5)),
], ids=["flatten", "reshape", "view_sum", "permute", "transpose", "transpose_neg",
        "squeeze_unsqueeze", "t", "expand", "expand_new_dims", "flip", "flip_two_axes"])
def test_layout(fn, wshape, tmp_path):
    """Each layout op is followed by a product with a trained tensor, so an element in the
    wrong place gives a wrong output and wrong gradients."""
    check(WithParam(fn, wshape), (randn(2, 3, 4, 5),), tmp_path)


@pytest.mark.parametrize("fn,wshape,shape", [
    (lambda x, w: torch.chunk(x, 2, 1)[0] * w + torch.chunk(x, 2, 1)[1], (2, 5), (2, 4, 5)),
    # only the last, shorter part is used: the others' gradient is zero
    (lambda x, w: x.chunk(3, -1)[2] * w, (4, 1), (2, 4, 7)),
    (lambda x, w: torch.cat([torch.split(x, 2, -1)[0] * w, torch.split(x, 2, -1)[2]], -1),
     (2,), (3, 4, 5)),
    # PyTorch skips a 1-D empty tensor in cat, whatever the others' rank (an empty KV cache)
    (lambda x, w: torch.cat([torch.tensor([]), x * w, torch.tensor([])], 1), (4, 3),
     (2, 4, 3)),
    (lambda x, w: torch.split(x, [1, 2, 4], 1)[1] * w, (2, 3), (2, 7, 3)),
    (lambda x, w: sum(t * w[i] for i, t in enumerate(x.unbind(-1))), (3, 4), (2, 3, 4, 3)),
    (lambda x, w: x.unbind(1)[1] * w, (3,), (2, 4, 3)),
    (lambda x, w: x.narrow(1, 1, 2) * w, (2, 3), (2, 4, 3)),
    (lambda x, w: x[:, 0] * w + x[:, -1], (3,), (2, 4, 3)),
    (lambda x, w: x[:, 1:5] * w, (4, 3), (2, 6, 3)),
    (lambda x, w: x[:, -3:-1] * w, (2, 3), (2, 6, 3)),
    (lambda x, w: x[..., ::2] * w, (3,), (2, 6, 5)),
    (lambda x, w: x[:, 1::3, :] * w, (2, 5), (2, 6, 5)),  # the last kept is not the last
    (lambda x, w: x[1:, ::2, -2] * w, (2, 5), (3, 4, 3, 5)),  # batch, step and select
    (lambda x, w: x[3:9:2] * w + x.narrow(0, 0, 3) + x[-1], (3,), (10,)),
    (lambda x, w: x.view(2, 3, 2, 2, 3)[:, :, 1, :, 1:] * w, (3, 2, 2), (2, 3, 4, 3)),
], ids=["chunk_both", "chunk_last_only", "split_skip_middle", "cat_empty_1d", "split_sizes",
        "unbind_all", "unbind_one", "narrow", "select", "slice", "slice_negative", "slice_step2",
        "slice_step3_tail", "slice_chain", "slices_1d", "slice_rank5"])
def test_slicing(fn, wshape, shape, tmp_path):
    """Every part is multiplied by a trained tensor or summed, so a wrong element gives a
    wrong output; the input's gradient is zero exactly where no part reads it."""
    check(WithParam(fn, wshape), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("fn,wshape,shape", [
    (lambda x, w: x.view(4, 6).t().reshape(-1) * w + x.t(), (24,), (24,)),
    (lambda x, w: x.permute(2, 0, 1) * w, (2, 1), (2, 3, 4)),
    (lambda x, w: (x.view(2, 3, 2, 2, 5).permute(4, 0, 3, 2, 1) * w).reshape(5, 24),
     (2, 2, 3), (2, 3, 4, 5)),
    (lambda x, w: x.view(2, 3, 2, 2, 5).transpose(1, -1).flatten(3) * w, (6,), (2, 3, 4, 5)),
    (lambda x, w: x.transpose(0, 2).contiguous().view(4, -1) * w, (30,), (2, 3, 4, 5)),
], ids=["1d", "3d_permute", "5d_permute", "5d_transpose", "4d_swap_batch"])
def test_layout_ranks(fn, wshape, shape, tmp_path):
    check(WithParam(fn, wshape), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("fn", [
    lambda x: torch.roll(x, 2, 3),
    lambda x: torch.roll(x, (-1, 3), (1, 2)) * x,
    lambda x: x.roll(5, -1),  # a whole turn: x itself
], ids=["one_dim", "two_dims_negative", "whole_turn"])
def test_roll(fn, tmp_path):
    check(Fn(fn), (randn(2, 3, 4, 5),), tmp_path)
