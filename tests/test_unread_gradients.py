"""A LayerNorm whose gamma and beta do not train (frozen, as under LoRA, or absent) computes
no weight gradients: its backward is the dx-only kernel, and no gradient buffer of gamma's
shape exists (training/unread_gradients.py). It trains like PyTorch (the referee); a
LayerNorm that trains its bias alone keeps the whole backward."""

import pytest
import torch
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub

FEATURES = 12


class Net(nn.Module):
    def __init__(self, affine=True):
        super().__init__()
        self.fc1 = nn.Linear(6, FEATURES, bias=False)  # no other gradient of [FEATURES]
        self.norm = nn.LayerNorm(FEATURES, elementwise_affine=affine)
        self.fc2 = nn.Linear(FEATURES, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x)))).mean(1)


def _frozen():
    model = Net()
    model.norm.requires_grad_(False)
    with torch.no_grad():  # not the identity, as after pretraining
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    return model


def _bias_trains():
    model = _frozen()
    model.norm.bias.requires_grad_(True)
    return model


CASES = {"frozen": (_frozen, False), "no_affine": (lambda: Net(affine=False), False),
         "bias_trains": (_bias_trains, True)}


@pytest.mark.parametrize("case", list(CASES))
def test_layer_norm_weight_gradients_only_where_they_train(case, tmp_path):
    make, weight_grads = CASES[case]
    torch.manual_seed(0)
    judged = assert_trains_like_torch(make(), batches((4, 5, 6), 3), ub.SGD(lr=0.1, momentum=0.9),
                                      tmp_path)
    train = judged.package.programs["train_step"]
    kernels = [c.kernel for c in train.calls if "layer_norm" in c.kernel]
    backward = [k for k in kernels if "backward" in k]
    assert len(backward) == 1
    assert ("input_backward" not in backward[0]) == weight_grads, kernels
    grads = [s.shape for s in train.slots() if s.kind == "gradient"]
    assert ((FEATURES,) in grads) == weight_grads, grads
