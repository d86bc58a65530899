"""Whole models: N training steps through the generated C against the same steps in PyTorch.

Every step's loss, and the final parameters and buffers (BatchNorm running statistics and
num_batches_tracked included), must agree within 1e-4 relative.
"""

import copy

import numpy as np
import pytest
import torch

import ubitrain as ub
from ubitrain.zoo import ZOO

STEPS = 10
BATCH = 4
RTOL = 1e-4

OPTIMIZERS = {
    "sgd": (lambda: ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4)),
    "adam": (lambda: ub.Adam(lr=1e-3),
             lambda p: torch.optim.Adam(p, lr=1e-3)),
}


def relative_error(actual, expected) -> float:
    expected = np.asarray(expected, np.float64)
    scale = max(np.abs(expected).max(), 1e-12)
    return float(np.abs(np.asarray(actual, np.float64) - expected).max() / scale)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", ["lenet5", "mobilenetv2_small", "resnet_small",
                                        "mlp_layernorm_gelu"])
def test_training_matches_pytorch(model_name, optimizer, tmp_path):
    entry = ZOO[model_name]
    torch.manual_seed(0)
    model = entry.factory().train()
    batches = [(torch.randn(BATCH, *entry.sample_shape),
                torch.randint(0, entry.classes, (BATCH,))) for _ in range(STEPS)]
    make_ub, make_torch = OPTIMIZERS[optimizer]

    pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1],
                     loss="cross_entropy", optimizer=make_ub(), out_dir=tmp_path / model_name)
    trainer = pkg.build()
    reference = make_torch(model.parameters())

    for step, (x, y) in enumerate(batches):
        loss = trainer.step(x, y)
        reference.zero_grad()
        expected = torch.nn.functional.cross_entropy(model(x), y)
        expected.backward()
        reference.step()
        assert relative_error(loss, expected.item()) <= RTOL, f"loss differs at step {step}"

    params = trainer.parameters()
    state = model.state_dict()
    assert set(params) == set(state)
    for name, value in state.items():
        assert params[name].shape == tuple(value.shape), name
        assert relative_error(params[name], value.numpy()) <= RTOL, name

    # Evaluation mode (running statistics, no dropout) agrees too.
    model.eval()
    x = batches[-1][0]
    with torch.no_grad():
        assert relative_error(trainer.predict(x), model(x).numpy()) <= RTOL


def test_frozen_parameters_get_no_gradient_and_stay(tmp_path):
    torch.manual_seed(1)
    model = ZOO["lenet5"].factory().train()
    x, y = torch.randn(BATCH, 1, 32, 32), torch.randint(0, 10, (BATCH,))
    trainable = ["classifier.4.weight", "classifier.4.bias"]
    pkg = ub.compile(copy.deepcopy(model), (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9),
                     trainable=trainable, out_dir=tmp_path / "frozen")
    full = ub.compile(copy.deepcopy(model), (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9),
                      out_dir=tmp_path / "full")
    # Gradients that nothing needs are never computed, so the step needs less memory.
    assert pkg.memory_plan.arena_bytes < full.memory_plan.arena_bytes
    trainer = pkg.build()

    for p in model.parameters():
        p.requires_grad_(False)
    head = [model.classifier[4].weight, model.classifier[4].bias]
    for p in head:
        p.requires_grad_(True)
    reference = torch.optim.SGD(head, lr=0.1, momentum=0.9)
    for _ in range(3):
        trainer.step(x, y)
        reference.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        reference.step()
    params = trainer.parameters()
    for name, value in model.state_dict().items():
        assert relative_error(params[name], value.numpy()) <= RTOL, name
