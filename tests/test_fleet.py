"""The fleet (Flower + generated C trainers): the data split, one client's round, and a
simulated run whose aggregation is redone with plain PyTorch FedAvg, bit for bit."""

import numpy as np
import pytest
import torch

import ubitrain as ub
from ubitrain.fleet.data import label_split
from ubitrain.fleet.local import LocalTraining, batch_indices, exchanged_names, local_round
from ubitrain.zoo import DigitsCNN


@pytest.mark.parametrize("alpha", [None, 0.3, 100.0])
def test_label_split_gives_every_sample_to_exactly_one_client(alpha):
    labels = np.random.default_rng(1).integers(0, 10, 500)
    shards = label_split(labels, 20, alpha, seed=3)
    everything = np.sort(np.concatenate(shards))
    np.testing.assert_array_equal(everything, np.arange(500))
    assert min(len(s) for s in shards) >= 1


def test_a_small_alpha_skews_the_labels():
    labels = np.random.default_rng(1).integers(0, 10, 2000)

    def mean_classes(alpha):
        return np.mean([len(np.unique(labels[s])) for s in label_split(labels, 20, alpha, 0)])

    assert mean_classes(0.1) < 5 < mean_classes(None) == 10


def test_bad_fleet_arguments_get_a_clear_error():
    with pytest.raises(ub.UbitrainError, match="--clients 0"):
        label_split(np.zeros(10, np.int64), 0, None, 0)
    with pytest.raises(ub.UbitrainError, match="--non-iid -1"):
        label_split(np.zeros(10, np.int64), 2, -1.0, 0)


@pytest.fixture(scope="module")
def digits_trainers(tmp_path_factory):
    """(trainer, model) of the digits CNN compiled with SGD(lr=0.1, momentum), by momentum."""
    made = {}

    def get(momentum):
        if momentum not in made:
            torch.manual_seed(0)
            model = DigitsCNN()
            pkg = ub.compile(model, (torch.zeros(8, 1, 8, 8),), torch.zeros(8, dtype=torch.long),
                             optimizer=ub.SGD(lr=0.1, momentum=momentum), progress=False,
                             out_dir=tmp_path_factory.mktemp("fleet") / "digits")
            made[momentum] = (pkg.build(), model)
        return made[momentum]

    return get


def _torch_local_round(model, start, x, y, batches, lr, momentum, mu):
    """The client's round in PyTorch float64: a fresh SGD, FedProx's term in the loss."""
    model = model.double()
    model.load_state_dict({k: torch.as_tensor(v) for k, v in start.items()}, strict=False)
    anchor = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for idx in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[idx]).double()),
                                                 torch.from_numpy(y[idx]))
        loss = loss + mu / 2 * sum(((p - anchor[k]) ** 2).sum()
                                   for k, p in model.named_parameters())
        loss.backward()
        opt.step()
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("momentum, mu", [(0.9, 0.0), (0.0, 0.5)])
def test_a_local_round_trains_like_pytorch(digits_trainers, momentum, mu):
    """The second of two rounds: its optimizer starts afresh (the first round's momentum is
    zeroed) from the tensors it is sent; FedProx's proximal step is the proximal loss term."""
    trainer, model = digits_trainers(momentum)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 37)
    spec = LocalTraining(steps=6, batch=8, lr=0.1)
    names = exchanged_names(trainer, sparse=False)
    start = {k: v for k, v in trainer.parameters().items() if k in names}
    local_round(trainer, start, x, y, spec, seed=5, proximal_mu=mu)
    start = {k: v * np.float32(0.5) for k, v in start.items()}
    before = {**trainer.parameters(), **start}
    update, loss = local_round(trainer, start, x, y, spec, seed=7, proximal_mu=mu)
    assert sorted(update) == sorted(names) and np.isfinite(loss)
    want = _torch_local_round(model, before, x, y,
                              batch_indices(37, 6, 8, np.random.default_rng(7)), 0.1, momentum,
                              mu)
    for k, got in update.items():
        err = np.max(np.abs(got - want[k])) / max(np.max(np.abs(want[k])), 1e-6)
        assert err < 1e-4, (k, err)


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    """Three simulated clients, two rounds; client 1 crashes in round 2."""
    from ubitrain.fleet.simulate import run_fleet

    lines = []
    result = run_fleet(clients=3, rounds=2, local_steps=2, batch=16, progress=False,
                       out_dir=tmp_path_factory.mktemp("fleet") / "run", log=lines.append,
                       faults={(1, 2)})
    return result, lines


def _torch_fedavg(replies):
    """Plain FedAvg in PyTorch: the updates weighted by their clients' sample counts, summed in
    the order they arrived, in float32."""
    total = sum(n for _, n in replies)
    merged = {}
    for update, n in replies:
        for k, v in update.items():
            term = torch.from_numpy(v) * (n / total)
            merged[k] = term if k not in merged else merged[k] + term
    return {k: v.numpy() for k, v in merged.items()}


def test_the_servers_model_is_pytorch_fedavg_of_the_clients_updates_bit_for_bit(fleet_run):
    result, _ = fleet_run
    replies = result["strategy"].replies
    assert [len(replies[1]), len(replies[2])] == [3, 2]  # the crashed client is left out
    after_round_1 = np.load(f"{result['out_dir']}/checkpoints/round_001.npz")
    for round_, model in [(1, dict(after_round_1)), (2, result["model"])]:
        want = _torch_fedavg(replies[round_])
        assert sorted(want) == sorted(model)
        for k, v in want.items():
            np.testing.assert_array_equal(model[k], v, err_msg=f"round {round_}: {k}")


def test_what_a_client_sends_is_what_its_trainer_computed(fleet_run, digits_trainers):
    """Round 1, redone in this process from the initial model with client 0's batches: the
    update that crossed Flower's messages is the trainer's own, bit for bit."""
    from ubitrain.fleet.apps import trainer_and_shards

    result, _ = fleet_run
    setup = result["setup"]
    trainer, shards = trainer_and_shards(setup)
    x, y = shards[0]
    initial = dict(np.load(f"{result['out_dir']}/checkpoints/round_000.npz"))
    update, _ = local_round(trainer, initial, x, y, setup.local, seed=setup.client_seed(0, 1))
    sent = [u for u, n in result["strategy"].replies[1] if n == len(x)]
    assert any(all(np.array_equal(u[k], update[k]) for k in update) for u in sent)


def test_the_run_reports_each_round_and_ends_with_the_fleet_line(fleet_run):
    result, lines = fleet_run
    assert [m["failures"] for m in result["rounds"][1:]] == [0, 1]
    assert all(m["bytes_up"] > 0 and m["bytes_down"] > 0 for m in result["rounds"][1:])
    assert lines[-1] == (f"fleet: 3 clients, 2 rounds, test accuracy "
                         f"{100 * result['accuracy']:.1f}% (centralized "
                         f"{100 * result['central_accuracy']:.1f}%)")
    assert sum(line.startswith("round ") for line in lines) == 2


def test_a_sparse_update_sends_the_trained_parameters_and_the_buffers(tmp_path):
    torch.manual_seed(0)
    pkg = ub.compile(DigitsCNN(), (torch.zeros(8, 1, 8, 8),), torch.zeros(8, dtype=torch.long),
                     trainable=ub.SparseUpdate(biases=True, last_layers=1), progress=False,
                     out_dir=tmp_path / "sparse")
    trainer = pkg.build()
    names = set(exchanged_names(trainer, sparse=True))
    assert names == set(pkg.trainable) | {"features.1.running_mean", "features.1.running_var"}
    assert "features.0.weight" not in names and "classifier.weight" in names


def test_the_deployment_engine_runs_rounds_with_supernode_processes(tmp_path):
    """A SuperLink, two SuperNode processes (one drives a Cortex-M4 board under QEMU) and
    `flwr run`; the host client's process is killed in round 2: that round merges the board's
    update alone, and in round 3 the SuperNode's new ClientApp process takes part again."""
    from test_targets import require_tools

    from ubitrain.fleet.deployment import run_deployment

    require_tools("cortex-m4")
    rounds = run_deployment(clients=2, rounds=3, local_steps=3, emulated="cortex-m4",
                            out_dir=tmp_path / "deploy", log=lambda line: None, kill=((0, 2),))
    assert [m["round"] for m in rounds] == [0, 1, 2, 3]
    assert [(m["clients"], m["failures"], m["emulated"]) for m in rounds[1:]] == [
        (2, 0, 1), (2, 1, 1), (2, 0, 1)]
    assert rounds[3]["accuracy"] > rounds[0]["accuracy"]
