"""Sparse update: only the selected parameters train, exactly as in PyTorch with the rest
frozen, and the pruned backward pass needs less memory."""

import copy

import numpy as np
import pytest
import torch

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
    with pytest.raises(ub.CompileError, match="more layers than the model has"):
        ub.SparseUpdate(last_layers=4).select(params)


@pytest.mark.parametrize("rule", [ub.SparseUpdate(biases=True),
                                  ub.SparseUpdate(biases=True, last_layers=1)])
def test_sparse_update_trains_like_pytorch_with_the_rest_frozen(rule, tmp_path):
    entry = ZOO["resnet_small"]
    torch.manual_seed(1)
    model = entry.factory().train()
    batches = [(torch.randn(4, *entry.sample_shape), torch.randint(0, 10, (4,)))
               for _ in range(4)]
    pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1], trainable=rule,
                     optimizer=ub.SGD(lr=0.005, momentum=0.9), out_dir=tmp_path / "sparse")
    trainable = set(rule.select([n for n, _ in model.named_parameters()]))
    assert pkg.trainable == [n for n, _ in model.named_parameters() if n in trainable]
    trainer = pkg.build()
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    reference = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.005,
                                momentum=0.9)
    initial = copy.deepcopy(model.state_dict())
    for x, y in batches:
        loss = trainer.step(x, y)
        reference.zero_grad()
        expected = torch.nn.functional.cross_entropy(model(x), y)
        expected.backward()
        reference.step()
        assert abs(loss - expected.item()) <= 1e-4 * expected.item()
    params = trainer.parameters()
    for name, value in model.state_dict().items():
        v = value.numpy()
        assert np.abs(params[name] - v).max() <= 1e-4 * max(np.abs(v).max(), 1e-6), name
        if name in dict(model.named_parameters()) and name not in trainable:
            assert np.array_equal(params[name], initial[name].numpy()), name  # frozen


def test_pruned_backward_needs_less_memory(tmp_path):
    entry = ZOO["mobilenetv2_small"]
    x, y = torch.randn(4, *entry.sample_shape), torch.randint(0, 10, (4,))
    arena = {}
    for label, rule in [("full", None), ("biases", ub.SparseUpdate(biases=True)),
                        ("last2", ub.SparseUpdate(last_layers=2))]:
        pkg = ub.compile(entry.factory(), (x,), y, trainable=rule, out_dir=tmp_path / label)
        arena[label] = pkg.memory_plan.arena_bytes
    assert arena["last2"] < arena["biases"] < arena["full"]
    assert arena["last2"] * 3 < arena["full"]


def test_sparse_demo_learns_new_digits_in_less_memory(tmp_path):
    from ubitrain.demo_sparse import run_sparse_demo

    result = run_sparse_demo(epochs=2, out_dir=tmp_path / "demo", progress=False,
                             log=lambda *_: None)
    assert result["before"] < 0.2  # never saw the digits 5-9
    assert result["after"] >= 0.85
    assert abs(result["after"] - result["torch_after"]) <= 0.02
    assert result["full_arena"] > 2 * result["sparse_arena"]
