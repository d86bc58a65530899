"""Whole models of the zoo: N training steps through the generated C, each judged by the
fidelity referee against the same step in PyTorch (float64, with the tolerance of every tensor
taken from float32 PyTorch's own spread on it): every loss, parameter, buffer (BatchNorm
running statistics and num_batches_tracked included) and optimizer state tensor, and the
eval-mode output after the last step.

The referee measures PyTorch's own float32 spread at each step and compares the change each
step makes, so tensors that hold mostly rounding residue (the bias of a BatchNorm whose output
feeds another BatchNorm, with a zero gradient) are judged too, against that spread.
"""

import copy

import numpy as np
import pytest
from harness import assert_trains_like_torch, zoo_case

import ubitrain as ub

STEPS = 10
BATCH = 4

OPTIMIZERS = {
    "sgd": lambda: ub.SGD(lr=0.005, momentum=0.9, weight_decay=1e-4),
    "adam": lambda: ub.Adam(lr=1e-3),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", ["lenet5", "mobilenetv2_small", "resnet_small",
                                        "mlp_layernorm_gelu"])
def test_training_matches_pytorch(model_name, optimizer, tmp_path):
    model, data = zoo_case(model_name, BATCH, STEPS)
    judged = assert_trains_like_torch(model, data, OPTIMIZERS[optimizer](),
                                      tmp_path / model_name)
    state = model.state_dict()
    assert judged.parameters.keys() == state.keys()
    for name, value in state.items():
        assert judged.parameters[name].shape == tuple(value.shape), name


def test_frozen_parameters_get_no_gradient_and_stay(tmp_path):
    model, data = zoo_case("lenet5", BATCH, 3)
    trainable = ["classifier.4.weight", "classifier.4.bias"]
    judged = assert_trains_like_torch(model, data, ub.SGD(lr=0.1, momentum=0.9),
                                      tmp_path / "frozen", trainable=trainable)
    full = ub.compile(copy.deepcopy(model), data[0][:1], data[0][1],
                      optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=tmp_path / "full")
    # Gradients that nothing needs are never computed, so the step needs less memory.
    assert judged.package.memory_plan.arena_bytes < full.memory_plan.arena_bytes
    assert judged.package.trainable == trainable
    for name, value in model.named_parameters():
        if name not in trainable:
            assert np.array_equal(judged.parameters[name], value.detach().numpy()), name
