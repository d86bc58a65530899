"""A boolean attention mask computed in the step, not at compile time: a padding mask that is
a model input (Hugging Face's `attention_mask`, int64 0/1 per token) and varies per batch,
made bool and combined with a constant causal mask. It trains like
PyTorch (the referee), dead rows included (a sample whose keys are all padding: PyTorch's
safe softmax gives zeros), and stays an input of the step: its conversion to an additive
mask is a kernel of the step (ops/attention_mask.py). BERT with a padded batch:
tests/test_hf_models.py. A bool buffer (state) is refused by name."""

import pytest
import torch
import torch.nn.functional as F
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub

CLASSES, LENGTH, FEATURES = 3, 5, 4


class Padded(nn.Module):
    """Causal self-attention over tokens, the padding mask an input; padding's features
    zeroed by the mask as a float (int64 -> float32)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(FEATURES, 3 * FEATURES)
        self.out = nn.Linear(FEATURES, CLASSES)

    def forward(self, x, attention_mask):
        x = x * attention_mask.to(x.dtype)[..., None]
        q, k, v = self.qkv(x)[:, None].chunk(3, dim=-1)  # [b, 1, n, f] each
        causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
        mask = causal & attention_mask.to(torch.bool)[:, None, None, :]
        return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).mean((1, 2)))


def _padded_batches(batch, steps=3):
    """Right padding, left padding (its first rows attend to nothing under the causal mask)
    and, at batch 4, a sample that is all padding; a new mask per step."""
    gen = torch.Generator().manual_seed(batch)
    out = []
    for x, y in batches((batch, LENGTH, FEATURES), CLASSES, steps, seed=batch):
        mask = (torch.rand(batch, LENGTH, generator=gen) > 0.3).long()
        mask[0] = torch.arange(LENGTH) < 2 + len(out)  # right padding: 2, 3 then 4 tokens
        if batch > 1:
            mask[1, :2], mask[1, 2:] = 0, 1
        if batch > 3:
            mask[3] = 0
        out.append((x, mask, y))
    return out


@pytest.mark.parametrize("batch", [1, 4])
def test_a_padding_mask_input_trains_like_pytorch(batch, tmp_path):
    torch.manual_seed(0)
    data = _padded_batches(batch)
    assert len({tuple(m.flatten().tolist()) for _, m, _ in data}) == 3  # varies per step
    judged = assert_trains_like_torch(Padded(), data, ub.SGD(lr=0.1, momentum=0.9), tmp_path)
    calls = judged.package.programs["train_step"].calls
    masks = [c for c in calls if "attention_mask" in c.kernel]
    assert len(masks) == 1 and masks[0].args[0].kind != "constant"  # computed per step


class BufferMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril())
        self.fc = nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.fc(F.scaled_dot_product_attention(x, x, x, attn_mask=self.mask).sum(1))


def test_a_bool_buffer_is_refused_by_name(tmp_path):
    """A bool buffer is state (`load_parameters` may change it), which the C tensor table
    cannot hold: refused, naming it and what works instead."""
    with pytest.raises(ub.CompileError, match=r"tensor mask is bool.*a plain tensor attribute"):
        ub.compile(BufferMask(), (torch.randn(2, LENGTH, FEATURES),),
                   torch.zeros(2, dtype=torch.long), out_dir=tmp_path)


def test_a_float_made_an_integer_is_refused_by_name(tmp_path):
    model = nn.Sequential(nn.Linear(FEATURES, CLASSES))
    model.forward = lambda x: model[0](x.to(torch.int64).to(x.dtype))
    with pytest.raises(ub.UnsupportedOpError, match=r"float32 to int64 \(aten._to_copy\)"):
        ub.compile(model, (torch.randn(2, FEATURES),), torch.zeros(2, dtype=torch.long),
                   out_dir=tmp_path)
