"""precision="int8" on the host: the generated C equals NITI's numpy reference bit for bit
after N steps (every integer parameter after every step, predict's logits; the float loss
within rounding), the trainer's interface, and what int8 refuses."""

import numpy as np
import pytest
import torch
from niti_harness import (
    check_against_reference,
    niti_batches,
    niti_net,
)
from torch import nn

import ubitrain as ub

STEPS = 12


@pytest.mark.parametrize("adaptive", [False, True], ids=["exact", "adaptive"])
def test_host_c_equals_reference_bit_for_bit(tmp_path, adaptive):
    data = niti_batches(STEPS)
    config = ub.NITI(mu=(5, 3), milestones=(6,), adaptive_rescale=adaptive, max_interval=4)
    model = niti_net()
    pkg = ub.compile(model, (torch.from_numpy(data[0][0]),), torch.from_numpy(data[0][1]),
                     precision="int8", optimizer=config, out_dir=tmp_path / "m")
    stats = check_against_reference(pkg, model, data, config)
    assert stats["sites"] > 0
    assert stats["reductions"] + stats["skipped"] == stats["sites"] * STEPS
    assert (stats["skipped"] > 0) == adaptive


def test_int8_parameters_load_and_errors(tmp_path):
    data = niti_batches(2)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    pkg = ub.compile(niti_net(), (x,), y, precision="int8", out_dir=tmp_path / "m")
    with pkg.build() as trainer:
        before = trainer.int8_state()
        floats = trainer.parameters()
        trainer.load_parameters(floats)  # float weights re-quantize to the same int8
        after = trainer.int8_state()
        assert all(np.array_equal(before[k], after[k]) for k in before)
        with pytest.raises(ub.InputError, match="fixed at compile time"):
            trainer.step(data[0][0][:2], data[0][1][:2])
    # a float pipeline's arena for the same network is larger (4-byte floats, momentum)
    fp32 = ub.compile(niti_net(), (x,), y, optimizer=ub.SGD(0.05, momentum=0.9),
                      out_dir=tmp_path / "f")
    assert pkg.memory_plan.arena_bytes < fp32.memory_plan.arena_bytes

    with pytest.raises(ub.UnsupportedOpError,
                       match=r"1: aten\.layer_norm; 2: aten\.elu.*precision='fp32'"):
        ub.compile(nn.Sequential(nn.Linear(8, 8, bias=False), nn.LayerNorm(8), nn.ELU(),
                                 nn.Linear(8, 3, bias=False)),
                   (torch.randn(2, 8),), torch.tensor([0, 1]), precision="int8",
                   out_dir=tmp_path / "bad")
    with pytest.raises(ub.UnsupportedOpError, match="BatchNorm 2 .* cannot be folded"):
        ub.compile(nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.ReLU(), nn.BatchNorm2d(2),
                                 nn.Flatten(), nn.Linear(72, 3, bias=False)),
                   (x,), y % 3, precision="int8", optimizer=ub.NITI(batch_norm="fold"),
                   out_dir=tmp_path / "bad")
    with pytest.raises(ub.UnsupportedOpError, match=r"needs track_running_stats=True; 1 "
                                                    r"\(BatchNorm2d.*batch_norm='fold'"):
        ub.compile(nn.Sequential(nn.Conv2d(1, 2, 3, bias=False),
                                 nn.BatchNorm2d(2, track_running_stats=False),
                                 nn.Flatten(), nn.Linear(72, 3, bias=False)),
                   (x,), y % 3, precision="int8", optimizer=ub.NITI(batch_norm="integer"),
                   out_dir=tmp_path / "bad")
    with pytest.raises(ub.CompileError, match="ub.NITI"):
        ub.compile(niti_net(), (x,), y, precision="int8", optimizer=ub.SGD(0.1),
                   out_dir=tmp_path / "bad")
    with pytest.raises(ub.CompileError, match="cross_entropy"):
        ub.compile(niti_net(), (x,), y, precision="int8", loss="mse", out_dir=tmp_path / "bad")
    with pytest.raises(ub.CompileError, match="milestones"):
        ub.NITI(mu=(5, 4), milestones=())


def test_auto_batch_norm_is_integer_from_scratch_and_folded_once_trained(tmp_path):
    """NITI(batch_norm="auto"), the default: a BatchNorm with PyTorch's initial statistics
    (a net trained from scratch) trains NITI's integer BatchNorm; one that has seen batches
    (a trained net, fine-tuned) is folded, and its weights get an exponent per channel
    (weight_exponents="auto"). The package says which."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 0])
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                        nn.Linear(32, 3))
    fresh = ub.compile(net, (x,), y, precision="int8", out_dir=tmp_path / "fresh")
    net(x)  # the running statistics move: the net has seen a batch
    trained = ub.compile(net, (x,), y, precision="int8", out_dir=tmp_path / "trained")
    assert (fresh.config.batch_norm, trained.config.batch_norm) == ("integer", "fold")
    assert (fresh.config.weight_exponents, trained.config.weight_exponents) == ("tensor",
                                                                                "channel")
    plain = ub.compile(niti_net(), (torch.randn(4, 1, 8, 8),), y, precision="int8",
                       out_dir=tmp_path / "plain")
    assert plain.config.weight_exponents == "tensor"  # nothing folded


def test_float_fallback_ops_run_as_tables_bit_for_bit(tmp_path):
    """GELU, Tanh and Sigmoid run as compile-time tables (niti/tables.py) with or without
    NITI(float_fallback=...), which the int8 pipeline no longer needs; the C equals the
    reference bit for bit. LayerNorm has no table."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.GELU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.Tanh(),
                          nn.Flatten(), nn.Linear(32, 16, bias=False),
                          nn.GELU(approximate="tanh"), nn.Linear(16, 5, bias=False),
                          nn.Sigmoid())
    data = niti_batches(6)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    with pytest.raises(ub.CompileError, match="elementwise ops"):
        ub.NITI(float_fallback=("aten.layer_norm",))
    config = ub.NITI(mu=(5,), milestones=(), adaptive_rescale=True, max_interval=4,
                     float_fallback=("aten.gelu", "aten.tanh", "aten.sigmoid"))
    pkg = ub.compile(model, (x,), y, precision="int8", optimizer=config, out_dir=tmp_path / "m")
    check_against_reference(pkg, model, data, config)


@pytest.mark.parametrize("trainable", [["6.weight"], ["3.weight", "6.weight"],
                                       ub.SparseUpdate(last_layers=1)],
                         ids=["last", "last_two", "sparse_update"])
def test_frozen_layers_equal_the_reference_and_stay_unchanged(tmp_path, trainable):
    """trainable=: the frozen weights keep their initial int8 values, the backward pass stops
    at the first trained layer (fewer rescale sites), and the C still equals the reference
    bit for bit."""
    data = niti_batches(6)
    config = ub.NITI(mu=(5,), milestones=(), adaptive_rescale=True, max_interval=4)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    model = niti_net()
    pkg = ub.compile(model, (x,), y, precision="int8", optimizer=config, trainable=trainable,
                     out_dir=tmp_path / "m")
    trained = ["6.weight"] if not isinstance(trainable, list) else trainable
    assert pkg.trainable == trained
    with pkg.build() as trainer:
        initial = trainer.int8_parameters()
        for xb, yb in data:
            trainer.step(xb, yb)
        state = trainer.int8_parameters()
    for name in pkg.integer_parameters:
        assert np.array_equal(state[name], initial[name]) == (name not in trained), name
    stats = check_against_reference(pkg, model, data, config)
    everything = ub.compile(model, (x,), y, precision="int8", optimizer=config,
                            out_dir=tmp_path / "all")
    with everything.build() as trainer:
        assert stats["sites"] < trainer.rescale_stats()["sites"]


def test_int8_trainable_errors(tmp_path):
    data = niti_batches(1)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    for bad, match in ((["fc.weight"], r"fc\.weight.*0\.weight, 3\.weight, 6\.weight"),
                       (ub.SparseUpdate(biases=True), "name at least one")):
        with pytest.raises(ub.CompileError, match=match):
            ub.compile(niti_net(), (x,), y, precision="int8", trainable=bad,
                       out_dir=tmp_path / "m")
