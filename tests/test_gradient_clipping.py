"""Gradient clipping by global norm (`clip_grad_norm=max_norm` of ub.SGD / Adam / AdamW)
against torch.nn.utils.clip_grad_norm_ (the referee clips with it before PyTorch's optimizer
step). The batches alternate small and large inputs so that the norm is below max_norm at
some steps and above it at others, both asserted from PyTorch's own run, and never within 10%
of max_norm (where float rounding could take the other side of min(coefficient, 1))."""

import copy

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch, rel_err
from torch import nn

import ubitrain as ub
from ubitrain.program.gradient_clipping import CLIP

MAX_NORM = 1.0
CASES = {
    "sgd_momentum_weight_decay": ub.SGD(lr=0.1, momentum=0.9, weight_decay=0.01,
                                        clip_grad_norm=MAX_NORM),
    "adam": ub.Adam(lr=0.01, clip_grad_norm=MAX_NORM),
    "adamw": ub.AdamW(lr=0.01, weight_decay=0.1, clip_grad_norm=MAX_NORM),
}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))


def data(steps=6, batch=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 6, generator=g) * (4.0 if k % 2 else 0.2),
             torch.randint(0, 4, (batch,), generator=g)) for k in range(steps)]


def torch_norms(model, batches, optimizer, trained=None) -> list[float]:
    """The global gradient norm at each step of PyTorch's own float64 run with clipping."""
    from ubitrain.fidelity.reference import torch_optimizer

    ref = copy.deepcopy(model).double()
    params = [p for n, p in ref.named_parameters() if trained is None or n in trained]
    opt, norms = torch_optimizer(optimizer, params), []
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x.double()), y).backward()
        norms.append(float(nn.utils.clip_grad_norm_(params, optimizer.clip_grad_norm)))
        opt.step()
    return norms


def assert_clips_sometimes(norms, max_norm=MAX_NORM):
    assert any(n > 1.1 * max_norm for n in norms), f"no step clips: {norms}"
    assert any(n < 0.9 * max_norm for n in norms), f"every step clips: {norms}"
    assert all(abs(n - max_norm) > 0.1 * max_norm for n in norms), f"near max_norm: {norms}"


@pytest.mark.parametrize("case", list(CASES))
def test_clipping_trains_like_torch(case, tmp_path):
    model, batches, opt = mlp(), data(), CASES[case]
    assert_clips_sometimes(torch_norms(model, batches, opt))
    judged = assert_trains_like_torch(model, batches, opt, tmp_path)
    calls = judged.package.programs["train_step"].calls
    clip = [i for i, c in enumerate(calls) if c.kernel == CLIP]
    updates = [i for i, c in enumerate(calls) if "param" in c.attrs]
    assert len(clip) == 1 and len(updates) == 4 and clip[0] < min(updates)


def test_clipping_over_the_trained_parameters_only_with_micro_batches(tmp_path):
    """The first layer frozen: its gradient is not computed and not in the norm. Two
    micro-batches: the norm is that of the accumulated gradient."""
    model, batches, opt = mlp(), data(), ub.Adam(lr=0.01, clip_grad_norm=0.8)
    model[0].requires_grad_(False)
    assert_clips_sometimes(torch_norms(model, batches, opt, trained={"2.weight", "2.bias"}),
                           0.8)
    judged = assert_trains_like_torch(model, batches, opt, tmp_path, micro_batches=2)
    assert judged.package.trainable == ["2.weight", "2.bias"]


def test_clipping_with_eval_mode_batch_norm(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[1].running_var.uniform_(0.2, 2.0)
    model.eval()
    opt = ub.SGD(lr=0.1, momentum=0.9, clip_grad_norm=MAX_NORM)
    batches = data(seed=3)
    assert_clips_sometimes(torch_norms(model.eval(), batches, opt))
    assert_trains_like_torch(model, batches, opt, tmp_path)


def test_clipping_a_channel_sparse_update_counts_the_trained_rows_only(tmp_path):
    """The referee trains whole parameters; here PyTorch's float64 run zeroes the frozen rows'
    gradients before clip_grad_norm_ (so the norm is over the trained rows) and puts the
    rows back after the step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(),
                          nn.Linear(8, 4))
    batches = data(seed=4)
    rows = {"0.weight": 8, "2.weight": 2, "0.bias": 16, "2.bias": 8, "4.bias": 4}
    max_norm = 0.25
    opt = ub.SGD(lr=0.1, momentum=0.9, clip_grad_norm=max_norm)
    pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1], optimizer=opt,
                     trainable=ub.SparseUpdate(biases=True, channels={"0": 0.5, "2": 0.25}),
                     out_dir=tmp_path)
    assert sorted(n for n in pkg.trainable if "[" in n) == ["0.weight[0:8]", "2.weight[0:2]"]

    ref = copy.deepcopy(model).double()
    initial = copy.deepcopy(ref.state_dict())
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    losses, norms = [], []
    for x, y in batches:
        sgd.zero_grad()
        loss = nn.functional.cross_entropy(ref(x.double()), y)
        loss.backward()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p.grad[rows.get(name, 0):] = 0
        norms.append(float(nn.utils.clip_grad_norm_(ref.parameters(), max_norm)))
        sgd.step()
        with torch.no_grad():
            for name, p in ref.named_parameters():
                p[rows.get(name, 0):] = initial[name][rows.get(name, 0):]
        losses.append(loss.item())
    assert_clips_sometimes(norms, max_norm)

    trainer = pkg.build()
    for got, want in zip(trainer.train(batches), losses, strict=True):
        assert rel_err(got, want) <= 1e-4
    params = trainer.parameters()
    for name, value in ref.state_dict().items():
        assert rel_err(params[name], value.numpy()) <= 1e-4, name
        assert np.array_equal(params[name][rows.get(name, 0):],
                              initial[name].float().numpy()[rows.get(name, 0):]), name


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_clip_grad_norm_is_checked(value):
    for cls in (ub.SGD, ub.Adam, ub.AdamW):
        with pytest.raises(ub.CompileError, match="clip_grad_norm"):
            cls(clip_grad_norm=value)


def test_no_clipping_no_clip_call(tmp_path):
    model, batches = mlp(), data(steps=1)
    x, y = batches[0]
    pkg = ub.compile(model, (x,), y, optimizer=ub.Adam(lr=0.01), out_dir=tmp_path)
    calls = pkg.programs["train_step"].calls
    assert not any(c.kernel == CLIP for c in calls)
    assert calls[0].args[0].shape == (3,)  # the optimizer's own coefficients, no clip slot
