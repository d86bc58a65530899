"""Parameters and buffers that are not plain trainable float tensors, trained in the C as
PyTorch trains them: a parameter tied between layers (one tensor, gradients of every use
summed, one optimizer state), parameters frozen with requires_grad_(False), and int64
buffers. The referee is PyTorch autograd and torch.optim on a float64 copy of the model."""

import copy

import numpy as np
import pytest
import torch
from op_harness import RTOL, rel_err
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


def batches(model_in: int, classes: int, n: int = 3, batch: int = 4):
    torch.manual_seed(5)
    return [(torch.randn(batch, model_in), torch.randint(0, classes, (batch,)))
            for _ in range(n)]


def train_both(model, data, optimizer, torch_optimizer, tmp_path, **compile_kw):
    """`len(data)` steps in the C and in float64 PyTorch; (trainer, reference model)."""
    reference = copy.deepcopy(model).double()
    pkg = ub.compile(copy.deepcopy(model), data[0][:1], data[0][1], optimizer=optimizer,
                     out_dir=tmp_path / "m", **compile_kw)
    trainer = pkg.build()
    opt = torch_optimizer([p for p in reference.parameters() if p.requires_grad])
    for x, y in data:
        loss = trainer.step(x, y)
        opt.zero_grad()
        expected = nn.functional.cross_entropy(reference(x.double()), y)
        expected.backward()
        opt.step()
        assert rel_err(loss, expected.item()) <= RTOL
    return trainer, reference


def assert_state_matches(trainer, reference):
    """Every state_dict name reported, float tensors within RTOL, int64 ones exact."""
    params = trainer.parameters()
    want = reference.state_dict()
    assert sorted(params) == sorted(want)
    for name, value in want.items():
        if value.dtype == torch.int64:
            assert params[name].dtype == np.int64 and np.array_equal(params[name], value), name
        else:
            assert params[name].dtype == np.float32, name
            assert rel_err(params[name], value.numpy()) <= RTOL, name


# ---- tied parameters ------------------------------------------------------------------------

def test_tied_weight_sums_both_gradients_with_one_momentum(tmp_path):
    torch.manual_seed(0)
    model = TiedLinears()
    trainer, reference = train_both(
        model, batches(6, 3), ub.SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01), tmp_path)
    assert reference.a.weight is reference.b.weight
    assert trainer.package.trainable == ["a.weight", "a.bias", "b.bias", "head.weight",
                                         "head.bias"]
    assert_state_matches(trainer, reference)  # b.weight reported too, equal to a.weight
    params = trainer.parameters()
    assert np.array_equal(params["a.weight"], params["b.weight"])
    assert len(trainer.optimizer_state()) == 5  # one momentum buffer for the tied weight


def test_a_module_used_twice_trains_like_pytorch_with_adam(tmp_path):
    torch.manual_seed(1)
    model = SharedBlock()
    trainer, reference = train_both(model, batches(5, 4), ub.Adam(lr=0.01),
                                    lambda ps: torch.optim.Adam(ps, lr=0.01), tmp_path)
    assert sorted(trainer.parameters()) == sorted(model.state_dict())
    assert_state_matches(trainer, reference)


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
    for name, p in model.named_parameters():  # the reference trains the same two
        p.requires_grad_(name in ("a.weight", "head.bias"))
    trainer, reference = train_both(
        model, batches(6, 3), ub.SGD(lr=0.1, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), tmp_path,
        trainable=["b.weight", "head.bias"])
    assert trainer.package.trainable == ["a.weight", "head.bias"]
    assert_state_matches(trainer, reference)


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
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer, reference = train_both(
        model, batches(6, 3), ub.SGD(lr=0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), tmp_path, trainable=trainable)
    assert trainer.package.trainable == [n for n, p in model.named_parameters()
                                         if p.requires_grad]
    params = trainer.parameters()
    for name in ("b.weight", "b.bias"):
        assert np.array_equal(params[name], initial[name].numpy()), name
    assert len(trainer.optimizer_state()) == len(trainer.package.trainable)
    assert_state_matches(trainer, reference)


def test_trainable_naming_a_frozen_parameter_is_refused(tmp_path):
    with pytest.raises(ub.CompileError, match=r"\['b.bias'\], which have requires_grad=False"):
        ub.compile(PartlyFrozen(), (torch.randn(4, 6),), torch.zeros(4, dtype=torch.int64),
                   trainable=["a.weight", "b.bias"], out_dir=tmp_path / "m")


# ---- int64 buffers --------------------------------------------------------------------------

def test_int64_buffers_keep_their_values_and_dtype(tmp_path):
    torch.manual_seed(6)
    model = Int64Buffer()
    trainer, reference = train_both(
        model, batches(4, 3), ub.SGD(lr=0.1, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), tmp_path)
    assert_state_matches(trainer, reference)
    x = torch.randn(4, 4)
    with torch.no_grad():
        want = reference(x.double()).numpy()
    assert rel_err(trainer.predict(x), want) <= RTOL
    # A new value loads (and the read one is used by the next forward pass).
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
    initial = {k: v.copy() for k, (v, _) in pkg.layer_program.weights.items()}
    with pkg.build() as trainer:
        for _ in range(3):
            trainer.step(x, y)
        state = trainer.int8_state()
    assert np.array_equal(state["0.weight"], initial["0.weight"])
    assert not np.array_equal(state["3.weight"], initial["3.weight"])
    with pytest.raises(ub.CompileError, match=r"\['0.weight'\], which have requires_grad"):
        ub.compile(model, (torch.from_numpy(x),), torch.from_numpy(y), precision="int8",
                   trainable=["0.weight", "3.weight"], out_dir=tmp_path / "m2")
