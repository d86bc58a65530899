"""Attention trains through the generated C as in PyTorch: F.scaled_dot_product_attention and
nn.MultiheadAttention, each configuration judged over 3 steps against PyTorch in float64
(ubitrain.fidelity.referee) with SGD (momentum), some with Adam too; and what is not supported is
refused by name."""

import copy

import pytest
import torch
import torch.nn.functional as F
from harness import assert_trains_like_torch, batches, rel_err
from op_harness import RTOL
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.dropout import dropout_mask

CLASSES = 3
OPTIMIZERS = [ub.SGD(lr=0.1, momentum=0.9), ub.Adam(lr=1e-2)]


class SDPA(nn.Module):
    """x (batch, length, features) -> q, k, v by Linear layers, `lead` extra dims of heads,
    scaled_dot_product_attention, a Linear head on the flattened result. Keys and values
    come from the first `keys` positions, so that their length can differ from the query's."""

    def __init__(self, features, length, heads=(), head_dim=4, value_dim=None, keys=None,
                 gain=1.0, **sdpa):
        super().__init__()
        self.heads, self.keys, self.gain, self.sdpa = tuple(heads), keys or length, gain, sdpa
        width = int(torch.tensor(self.heads).prod()) if self.heads else 1
        self.head_dim, self.value_dim = head_dim, value_dim or head_dim
        self.q = nn.Linear(features, width * head_dim)
        self.k = nn.Linear(features, width * head_dim)
        self.v = nn.Linear(features, width * self.value_dim)
        self.out = nn.Linear(width * length * self.value_dim, CLASSES)

    def _split(self, t, dim):  # (batch, length, heads * dim) -> (batch, *heads, length, dim)
        b, n = t.shape[:2]
        t = t.reshape(b, n, *self.heads, dim)
        return t.permute(0, *range(2, 2 + len(self.heads)), 1, 2 + len(self.heads))

    def forward(self, x):
        kv = x[:, :self.keys]
        q = self._split(self.q(x), self.head_dim) * self.gain
        y = F.scaled_dot_product_attention(q, self._split(self.k(kv), self.head_dim),
                                           self._split(self.v(kv), self.value_dim), **self.sdpa)
        return self.out(y.flatten(1))


def _bool_mask(rows, cols):
    """True: attend. Row 1 attends to nothing: PyTorch gives it zeros, not NaN."""
    mask = torch.rand(rows, cols, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[:, 0] = True
    mask[1] = False
    return mask


def _float_mask(rows, cols):
    mask = torch.randn(rows, cols, generator=torch.Generator().manual_seed(4))
    mask[0, 1:] = float("-inf")
    return mask


# (id, model factory, batch, length, features)
SDPA_CASES = [
    ("no-mask", lambda: SDPA(6, 5, heads=(2,)), 2, 5, 6),
    ("causal-batch1-odd", lambda: SDPA(5, 7, heads=(3,), head_dim=3, is_causal=True), 1, 7, 5),
    ("scale-3d", lambda: SDPA(4, 6, head_dim=5, scale=0.3), 3, 6, 4),
    ("causal-fewer-keys-5d", lambda: SDPA(4, 5, heads=(2, 3), keys=3, value_dim=2,
                                          is_causal=True), 2, 5, 4),
    ("bool-mask", lambda: SDPA(6, 5, heads=(2,), attn_mask=_bool_mask(5, 5)), 2, 5, 6),
    ("float-mask", lambda: SDPA(6, 5, heads=(2,), keys=4, attn_mask=_float_mask(5, 4)),
     1, 5, 6),
    # scores up to about 300: exp without the row's maximum subtracted overflows (above 88.7)
    ("large-scores", lambda: SDPA(6, 5, heads=(2,), gain=200.0), 2, 5, 6),
]


class MHA(nn.Module):
    """nn.MultiheadAttention self-attention between two Linear layers; `use_weights` adds
    the averaged attention weights to the output (need_weights=True, used), else the call
    passes `need_weights` and the weights are discarded."""

    def __init__(self, embed, heads, length, batch_first=True, bias=True, need_weights=None,
                 use_weights=False, attn_mask=None, cross=False):
        super().__init__()
        self.inp = nn.Linear(4, embed)
        self.attn = nn.MultiheadAttention(embed, heads, bias=bias, batch_first=batch_first)
        self.out = nn.Linear(length * embed, CLASSES)
        self.batch_first, self.use_weights, self.attn_mask = batch_first, use_weights, attn_mask
        self.cross = nn.Linear(4, embed) if cross else None
        self.kwargs = {} if need_weights is None else {"need_weights": need_weights}

    def forward(self, x):
        h = self.inp(x)
        kv = self.cross(x[:, : x.shape[1] // 2 + 1]) if self.cross is not None else h
        if not self.batch_first:
            h, kv = h.transpose(0, 1), kv.transpose(0, 1)
        y, w = self.attn(h, kv, kv, attn_mask=self.attn_mask, **self.kwargs)
        if not self.batch_first:
            y = y.transpose(0, 1)
        if self.use_weights:
            y = y + w.sum(-1, keepdim=True) * w.mean()
        return self.out(y.flatten(1))


MHA_CASES = [
    ("batch-first-weights-discarded", lambda: MHA(8, 2, 5), 2, 5),
    ("seq-first-no-bias-need-weights-false",
     lambda: MHA(8, 2, 5, batch_first=False, bias=False, need_weights=False), 2, 5),
    ("batch-first-weights-used", lambda: MHA(8, 4, 6, use_weights=True), 3, 6),
    ("seq-first-batch1-odd", lambda: MHA(9, 3, 7, batch_first=False, need_weights=False),
     1, 7),
    ("causal-mask-need-weights-false",  # True: masked, as nn.MultiheadAttention reads it
     lambda: MHA(8, 2, 5, need_weights=False,
                 attn_mask=~torch.ones(5, 5, dtype=torch.bool).tril()), 2, 5),
    ("causal-mask-weights-discarded",
     lambda: MHA(8, 2, 5, attn_mask=~torch.ones(5, 5, dtype=torch.bool).tril()), 2, 5),
    ("cross-attention", lambda: MHA(8, 2, 6, need_weights=False, cross=True), 2, 6),
]


def with_optimizers(cases, adam_for):
    """Every case with SGD (momentum), whose update is linear in the gradient: the strictest
    check of the attention's backward; Adam for `adam_for` alone. The update kernel is the
    same elementwise one whatever the graph (test_optimizers.py judges each optimizer), so
    Adam on every configuration judged the same attention kernels a second time."""
    out = []
    for case_id, *case in cases:
        for name, optimizer in zip(["sgd", "adam"], OPTIMIZERS):
            if name == "sgd" or case_id in adam_for:
                out.append(pytest.param(*case, optimizer, id=f"{case_id}-{name}"))
    return out


@pytest.mark.parametrize("make,batch,length,features,optimizer", with_optimizers(
    SDPA_CASES, adam_for={"causal-fewer-keys-5d", "large-scores"}))
def test_scaled_dot_product_attention_trains_like_pytorch(make, batch, length, features,
                                                          optimizer, tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(make(), batches((batch, length, features), CLASSES), optimizer,
                             tmp_path)


@pytest.mark.parametrize("make,batch,length,optimizer", with_optimizers(
    MHA_CASES, adam_for={"batch-first-weights-used", "causal-mask-need-weights-false"}))
def test_multihead_attention_trains_like_pytorch(make, batch, length, optimizer, tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(make(), batches((batch, length, 4), CLASSES), optimizer, tmp_path)


def test_multihead_attention_dropout_uses_the_c_runtime_masks(tmp_path, monkeypatch):
    """need_weights=True: the dropout on the attention weights is the C runtime's Dropout.
    The referee cannot give PyTorch those masks there (F.dropout is called inside
    F.multi_head_attention_forward, which its TorchFunctionMode sees as one call), so this
    replaces F.dropout itself, which that function looks up, in a float64 PyTorch step."""
    torch.manual_seed(0)
    model = MHA(8, 2, 5)
    model.attn.dropout = 0.25
    (x, y), = batches((2, 5, 4), CLASSES, steps=1)
    seed = 7
    trainer = ub.compile(model, (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9),
                         out_dir=tmp_path).build(seed=seed)
    trainer.step(x, y)
    got = trainer.parameters()

    rng = [seed]

    def c_runtime_dropout(t, p=0.5, training=True, inplace=False):
        mask, rng[0] = dropout_mask(rng[0], tuple(t.shape), p)
        return t * torch.from_numpy(mask).to(t.dtype)

    ref = copy.deepcopy(model).double()
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    monkeypatch.setattr(F, "dropout", c_runtime_dropout)
    F.cross_entropy(ref(x.double()), y).backward()
    optimizer.step()
    monkeypatch.undo()
    assert rng[0] != seed, "PyTorch's MultiheadAttention drew no Dropout mask"
    for name, p in ref.named_parameters():
        change = (p - before[name]).detach().numpy()
        assert rel_err(got[name] - before[name].numpy(), change) < RTOL, name


class Call(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn, self.fc = fn, nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.fc(self.fn(x).sum(1))


class SelfAttention(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True, **kwargs)


def _refused(model, fragment, tmp_path, x=None):
    x = torch.randn(2, 5, 4) if x is None else x
    with pytest.raises(ub.UnsupportedOpError, match=fragment):
        ub.compile(model, (x,), torch.zeros(2, dtype=torch.long), out_dir=tmp_path)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(dropout_p=0.1), r"scaled_dot_product_attention with dropout_p=0.1 .*use attn_mask"),
    (dict(enable_gqa=True), r"enable_gqa=True .*repeat the key and value heads"),
])
def test_sdpa_variants_without_a_lowering_are_refused(kwargs, fragment, tmp_path):
    _refused(Call(lambda x: F.scaled_dot_product_attention(x, x, x, **kwargs)), fragment,
             tmp_path)


def test_sdpa_float_mask_computed_at_run_time_is_refused(tmp_path):
    """(a boolean one works: tests/test_attention_mask_input.py)"""
    fragment = r"float32 attn_mask computed at run time .*a constant mask \(a plain tensor"
    _refused(Call(lambda x: F.scaled_dot_product_attention(
        x, x, x, attn_mask=x.sum(-1, keepdim=True))), fragment, tmp_path / "input")


def test_multihead_attention_key_padding_mask_is_refused(tmp_path):
    mha = SelfAttention()
    model = Call(lambda x: mha.attn(x, x, x, key_padding_mask=x[:, :, 0] > 0)[0])
    model.mha = mha
    _refused(model, r"attn \(nn.MultiheadAttention\): key_padding_mask is not supported",
             tmp_path)


def test_multihead_attention_dropout_without_weights_is_refused(tmp_path):
    mha = SelfAttention(dropout=0.1)
    model = Call(lambda x: mha.attn(x, x, x, need_weights=False)[0])
    model.mha = mha
    _refused(model, r"dropout=0.1 with need_weights=False .*need_weights=True", tmp_path)
