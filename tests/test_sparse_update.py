"""Sparse update: only the selected parameters train, exactly as in PyTorch with the rest
frozen, and the pruned backward pass needs less memory."""

import copy

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch, rel_err, torch_steps_with_frozen_rows, zoo_case

import ubitrain as ub
from ubitrain.zoo import ZOO


def test_selection():
    params = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    assert ub.SparseUpdate(biases=True).select(params) == ["conv.bias", "bn.bias", "fc.bias"]
    assert ub.SparseUpdate(last_layers=1).select(params) == ["fc.weight", "fc.bias"]
    assert ub.SparseUpdate(biases=True, last_layers=2).select(params) == [
        "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    with pytest.raises(ub.CompileError, match="selects nothing"):
        ub.SparseUpdate()
    # A layer trained whole (last_layers) needs no channel split.
    rule = ub.SparseUpdate(last_layers=1, channels={"conv": 0.5, "fc": 0.5})
    assert rule.channel_fractions(rule.select(params)) == {"conv": 0.5}
    with pytest.raises(ub.CompileError, match="more layers than the model has"):
        ub.SparseUpdate(last_layers=4).select(params)


@pytest.mark.parametrize("rule", [ub.SparseUpdate(biases=True),
                                  ub.SparseUpdate(biases=True, last_layers=1)])
def test_sparse_update_trains_like_pytorch_with_the_rest_frozen(rule, tmp_path):
    model, batches = zoo_case("resnet_small", 4, 4)
    judged = assert_trains_like_torch(model, batches, ub.SGD(lr=0.005, momentum=0.9),
                                      tmp_path / "sparse", trainable=rule)
    trainable = set(rule.select([n for n, _ in model.named_parameters()]))
    assert judged.package.trainable == [n for n, _ in model.named_parameters()
                                        if n in trainable]
    for name, p in model.named_parameters():
        if name not in trainable:
            assert np.array_equal(judged.parameters[name], p.detach().numpy()), name  # frozen


def test_a_fraction_of_channels_trains_like_pytorch_with_the_other_rows_frozen(tmp_path):
    """tiny-training's channel-sparse update: PyTorch trains the whole weight and the frozen
    rows are put back after each step, which is exact for an elementwise optimizer (the
    referee trains whole parameters only)."""
    model, batches = zoo_case("lenet5", 4, 3)
    rule = ub.SparseUpdate(biases=True, channels={"features.3": 0.5, "classifier.0": 0.25})
    pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1], trainable=rule,
                     optimizer=ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
                     out_dir=tmp_path / "channels")
    trained_rows = {"features.3.weight": 8, "classifier.0.weight": 30}  # ceil(16/2), ceil(120/4)
    assert [n for n in pkg.trainable if "[" in n] == ["features.3.weight[0:8]",
                                                       "classifier.0.weight[0:30]"]
    # The backward pass computes the weight gradient of the trained rows only; the linear
    # layer's goes block by block straight into their update (program/update_epilogue.py).
    train = pkg.programs["train_step"]
    grads = [s.shape for s in train.slots() if s.kind == "gradient"]
    assert (120, 400) not in grads
    assert (8, 6, 5, 5) in grads and (16, 6, 5, 5) not in grads
    (fc,) = [c for c in train.calls if c.attrs.get("param") == "classifier.0.weight[0:30]"]
    assert "matmul_update" in fc.kernel and fc.args[2].shape == (30, 400)

    want_losses, want = torch_steps_with_frozen_rows(
        model, batches, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
        {n: trained_rows.get(n, p.shape[0] if n.endswith(".bias") else 0)
         for n, p in model.named_parameters()})
    trainer = pkg.build()
    for got, expected in zip(trainer.train(batches), want_losses, strict=True):
        assert rel_err(got, expected) <= 1e-4
    params = trainer.parameters()
    for name, value in want.items():
        assert rel_err(params[name], value) <= 1e-4, name
    initial = model.state_dict()
    for name, rows in trained_rows.items():
        assert np.array_equal(params[name][rows:], initial[name].numpy()[rows:]), name
        assert not np.array_equal(params[name][:rows], initial[name].numpy()[:rows]), name


def test_channel_fractions_are_checked(tmp_path):
    entry = ZOO["mobilenetv2_small"]
    x, y = torch.randn(2, *entry.sample_shape), torch.randint(0, 10, (2,))
    depthwise = [n for n, m in entry.factory().named_modules()
                 if isinstance(m, torch.nn.Conv2d) and m.groups > 1][0]
    cases = [({depthwise: 0.5}, "groups=1"),
             ({"no_such_layer": 0.5}, "no layer 'no_such_layer'"),
             ({depthwise: 1.5}, r"must be in \(0, 1\]")]
    for channels, message in cases:
        with pytest.raises(ub.CompileError, match=message):
            ub.compile(entry.factory(), (x,), y, trainable=ub.SparseUpdate(channels=channels),
                       out_dir=tmp_path / "bad")


def test_pruned_backward_needs_less_memory(tmp_path):
    entry = ZOO["mobilenetv2_small"]
    x, y = torch.randn(4, *entry.sample_shape), torch.randint(0, 10, (4,))
    arena, adam_state = {}, {}
    for label, rule in [("full", None), ("biases", ub.SparseUpdate(biases=True)),
                        ("last2", ub.SparseUpdate(last_layers=2)),
                        ("head_quarter", ub.SparseUpdate(channels={"head.0": 0.25})),
                        ("head_whole", ub.SparseUpdate(channels={"head.0": 1.0}))]:
        pkg = ub.compile(entry.factory(), (x,), y, trainable=rule, optimizer=ub.Adam(),
                         out_dir=tmp_path / label)
        arena[label] = pkg.memory_plan.arena_bytes
        adam_state[label] = pkg.memory_plan.bytes_by_kind().get("optimizer_state", 0)
    assert arena["last2"] < arena["biases"] < arena["full"]
    assert arena["last2"] * 3 < arena["full"]
    # head.0 is a 1x1 Conv2d 16 -> 64: Adam keeps two moments for 16 of its 64 rows.
    assert adam_state["head_whole"] == 2 * 64 * 16 * 4
    assert adam_state["head_quarter"] == adam_state["head_whole"] // 4
    assert arena["head_quarter"] < arena["head_whole"]
    assert arena["last2"] * 3 < arena["full"]


def test_sparse_demo_learns_new_digits_in_less_memory(tmp_path):
    from ubitrain.demos.sparse import run_sparse_demo

    result = run_sparse_demo(epochs=2, out_dir=tmp_path / "demo", progress=False,
                             log=lambda *_: None)
    assert result["before"] < 0.2  # never saw the digits 5-9
    assert result["after"] >= 0.85
    assert abs(result["after"] - result["torch_after"]) <= 0.02
    assert result["full_arena"] > 2 * result["sparse_arena"]
