"""Parameters and buffers that are not plain trainable float tensors, trained in the C as
PyTorch trains them: a parameter tied between layers (one tensor, gradients of every use
summed, one optimizer state), parameters frozen with requires_grad_(False), and int64
buffers. Each is judged by the fidelity referee (harness.assert_trains_like_torch)."""

import copy

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch, batches, rel_err
from op_harness import RTOL
from torch import nn

import ubitrain as ub


class TiedLinears(nn.Module):
    """Two Linear layers sharing one weight (`b.weight = a.weight`), then a head."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.relu(self.a(x)))))


class SharedBlock(nn.Module):
    """One module used twice under two names: all of its parameters are tied."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(5, 5)
        self.again = self.block
        self.head = nn.Linear(5, 4)

    def forward(self, x):
        return self.head(torch.sigmoid(self.again(torch.tanh(self.block(x)))))


class PartlyFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.b.requires_grad_(False)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class Int64Buffer(nn.Module):
    """An int64 buffer that is never read, one read only by ops that do not reach the loss,
    and one that is read (promoted to float and added)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("idx", torch.arange(4))
        self.register_buffer("dead", torch.tensor([7, -2, 5]))
        self.register_buffer("offset", torch.tensor([1, 0, 2, 3]))

    def forward(self, x):
        _ = self.dead * 2 + 1  # computed, then dropped
        return self.fc(x + self.offset)


def data(model_in: int, classes: int):
    return batches((4, model_in), classes, steps=3, seed=5)


def assert_state_reported(judged, model):
    """Every state_dict name reported by the C, float tensors as float32, int64 ones as int64
    (the referee compares what is reported: float tensors against PyTorch's spread, integer
    ones exactly)."""
    params = judged.parameters
    want = model.state_dict()
    assert sorted(params) == sorted(want)
    for name, value in want.items():
        dtype = np.int64 if value.dtype == torch.int64 else np.float32
        assert params[name].dtype == dtype, name


# ---- tied parameters ------------------------------------------------------------------------

def test_tied_weight_sums_both_gradients_with_one_momentum(tmp_path):
    torch.manual_seed(0)
    model = TiedLinears()
    judged = assert_trains_like_torch(model, data(6, 3),
                                      ub.SGD(lr=0.1, momentum=0.9, weight_decay=0.01), tmp_path)
    assert judged.package.trainable == ["a.weight", "a.bias", "b.bias", "head.weight",
                                        "head.bias"]
    assert_state_reported(judged, model)  # b.weight reported too, equal to a.weight
    params = judged.parameters
    assert np.array_equal(params["a.weight"], params["b.weight"])
    assert len(judged.optimizer_state) == 5  # one momentum buffer for the tied weight


def test_a_module_used_twice_trains_like_pytorch_with_adam(tmp_path):
    torch.manual_seed(1)
    model = SharedBlock()
    judged = assert_trains_like_torch(model, data(5, 4), ub.Adam(lr=0.01), tmp_path)
    assert_state_reported(judged, model)


def test_tied_weight_loads_under_either_name_and_refuses_a_conflict(tmp_path):
    torch.manual_seed(2)
    model = TiedLinears()
    pkg = ub.compile(model, (torch.randn(4, 6),), torch.zeros(4, dtype=torch.int64),
                     out_dir=tmp_path / "m")
    trainer = pkg.build()
    new = np.full((6, 6), 0.25, np.float32)
    trainer.load_parameters({"b.weight": new})
    assert np.array_equal(trainer.parameters()["a.weight"], new)
    trainer.load_parameters({"a.weight": new * 2, "b.weight": new * 2})
    assert np.array_equal(trainer.parameters()["b.weight"], new * 2)
    trainer.load_parameters(trainer.parameters())  # what parameters() gives loads back
    before = trainer.parameters()
    with pytest.raises(ub.InputError, match="'a.weight' and 'b.weight' are one tensor"):
        trainer.load_parameters({"a.weight": new, "b.weight": new * 3, "head.bias":
                                 np.zeros(3, np.float32)})
    after = trainer.parameters()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing written


def test_trainable_may_name_a_tied_weight_by_either_name(tmp_path):
    torch.manual_seed(3)
    model = TiedLinears()
    judged = assert_trains_like_torch(model, data(6, 3), ub.SGD(lr=0.1, momentum=0.9), tmp_path,
                                      trainable=["b.weight", "head.bias"])
    assert judged.package.trainable == ["a.weight", "head.bias"]
    assert_state_reported(judged, model)
    for name, p in model.named_parameters():  # the others stay as they were
        if name not in ("a.weight", "head.bias"):
            assert np.array_equal(judged.parameters[name], p.detach().numpy()), name


def test_a_tied_weight_cannot_train_in_part(tmp_path):
    with pytest.raises(ub.CompileError, match="b.weight is tied to a.weight"):
        ub.compile(TiedLinears(), (torch.randn(4, 6),), torch.zeros(4, dtype=torch.int64),
                   trainable=ub.SparseUpdate(channels={"b": 0.5}), out_dir=tmp_path / "m")


# ---- requires_grad_(False) ------------------------------------------------------------------

@pytest.mark.parametrize("trainable", [None, ["a.weight", "a.bias", "c.weight", "c.bias"],
                                       ub.SparseUpdate(biases=True, last_layers=1)],
                         ids=["all", "list", "sparse"])
def test_frozen_parameters_stay_bit_identical(trainable, tmp_path):
    torch.manual_seed(4)
    model = PartlyFrozen()  # b frozen with requires_grad_(False)
    if isinstance(trainable, ub.SparseUpdate):  # the rule leaves a.weight out: so does torch
        model.a.weight.requires_grad_(False)
    judged = assert_trains_like_torch(model, data(6, 3), ub.SGD(lr=0.05, momentum=0.9),
                                      tmp_path, trainable=trainable)
    assert judged.package.trainable == [n for n, p in model.named_parameters()
                                        if p.requires_grad]
    params = model.state_dict()
    for name in ("b.weight", "b.bias"):
        assert np.array_equal(judged.parameters[name], params[name].numpy()), name
    assert len(judged.optimizer_state) == len(judged.package.trainable)
    assert_state_reported(judged, model)


def test_trainable_naming_a_frozen_parameter_is_refused(tmp_path):
    with pytest.raises(ub.CompileError, match=r"\['b.bias'\], which have requires_grad=False"):
        ub.compile(PartlyFrozen(), (torch.randn(4, 6),), torch.zeros(4, dtype=torch.int64),
                   trainable=["a.weight", "b.bias"], out_dir=tmp_path / "m")


# ---- int64 buffers --------------------------------------------------------------------------

def test_int64_buffers_keep_their_values_and_dtype(tmp_path):
    torch.manual_seed(6)
    model = Int64Buffer()
    judged = assert_trains_like_torch(model, data(4, 3), ub.SGD(lr=0.1, momentum=0.9),
                                      tmp_path)  # int64 buffers compared exactly
    assert_state_reported(judged, model)
    trainer = judged.trainer
    reference = copy.deepcopy(model).double()  # with the state the C reached
    reference.load_state_dict({k: torch.from_numpy(v) for k, v in trainer.parameters().items()})
    # A new value loads (and the read one is used by the next forward pass).
    x = torch.randn(4, 4)
    trainer.load_parameters({"offset": np.array([0, 0, 0, 0], np.int64)})
    assert trainer.parameters()["offset"].dtype == np.int64
    reference.offset.zero_()
    with torch.no_grad():
        want = reference(x.double()).numpy()
    assert rel_err(trainer.predict(x), want) <= RTOL


def test_an_int64_buffer_used_as_an_index_names_the_op(tmp_path):
    class Permute(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.register_buffer("order", torch.tensor([3, 2, 1, 0]))

        def forward(self, x):
            return self.fc(x[:, self.order])

    # a registered buffer may change at run time: refused, with what works instead
    with pytest.raises(ub.UnsupportedOpError, match=r"index computed inside the model or taken "
                       r"from its inputs or buffers is not supported; index by a constant"):
        ub.compile(Permute(), (torch.randn(4, 4),), torch.zeros(4, dtype=torch.int64),
                   out_dir=tmp_path / "m")


def test_int8_leaves_requires_grad_false_weights_alone(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 5, bias=False))
    model[0].requires_grad_(False)
    g = np.random.default_rng(0)
    x = g.standard_normal((4, 1, 8, 8)).astype(np.float32)
    y = g.integers(0, 5, 4)
    pkg = ub.compile(model, (torch.from_numpy(x),), torch.from_numpy(y), precision="int8",
                     out_dir=tmp_path / "m")
    assert pkg.trainable == ["3.weight"]
    with pkg.build() as trainer:
        initial = trainer.int8_parameters()
        for _ in range(3):
            trainer.step(x, y)
        state = trainer.int8_parameters()
    assert np.array_equal(state["0.weight"], initial["0.weight"])
    assert not np.array_equal(state["3.weight"], initial["3.weight"])
    with pytest.raises(ub.CompileError, match=r"\['0.weight'\], which have requires_grad"):
        ub.compile(model, (torch.from_numpy(x),), torch.from_numpy(y), precision="int8",
                   trainable=["0.weight", "3.weight"], out_dir=tmp_path / "m2")
