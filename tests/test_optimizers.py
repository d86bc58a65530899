"""Every optimizer option against torch.optim: five steps, every loss and parameter."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub

CASES = {
    "sgd_plain": (ub.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "sgd_weight_decay": (ub.SGD(lr=0.1, weight_decay=0.01),
                         lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01)),
    "sgd_momentum_dampening": (
        ub.SGD(lr=0.1, momentum=0.8, dampening=0.3),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, dampening=0.3)),
    "sgd_nesterov": (ub.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
                     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=1e-3)),
    "adam": (ub.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "adam_weight_decay_betas": (
        ub.Adam(lr=0.01, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1)),
    "adamw": (ub.AdamW(lr=0.01, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_matches_torch(case, tmp_path):
    ub_opt, make_torch = CASES[case]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
    batches = [(torch.randn(8, 6), torch.randint(0, 4, (8,))) for _ in range(5)]
    trainer = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1], optimizer=ub_opt,
                         out_dir=tmp_path / case).build()
    reference = make_torch(model.parameters())
    for x, y in batches:
        loss = trainer.step(x, y)
        reference.zero_grad()
        expected = nn.functional.cross_entropy(model(x), y)
        expected.backward()
        reference.step()
        assert abs(loss - expected.item()) <= 1e-5 * abs(expected.item())
    params = trainer.parameters()
    for name, value in model.state_dict().items():
        v = value.numpy()
        assert np.abs(params[name] - v).max() <= 1e-5 * np.abs(v).max(), name
    # The optimizer state is PyTorch's too (momentum buffer, Adam moments).
    state = trainer.optimizer_state()
    for name, p in model.named_parameters():
        for key, value in reference.state[p].items():
            if key != "step":
                got = state[f"{name}.{key}"]
                assert np.abs(got - value.numpy()).max() <= 1e-5 * np.abs(value.numpy()).max()
