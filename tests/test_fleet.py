"""The fleet (Flower + generated C trainers): the data split, one client's round, and a
simulated run whose aggregation is redone with plain PyTorch FedAvg, bit for bit."""

import numpy as np
import pytest
import torch
from fleet_harness import copied_project, digits_shards, same_training

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


@pytest.mark.parametrize("change, message", [
    (dict(strategy="fedprox"), "FedProx's proximal step is exact for plain SGD only"),
    (dict(strategy="nope"), "choose one of fedavg, fedprox, fedadam"),
    (dict(precision="int8", strategy="fedadam"), "use strategy='fedavg'"),
    (dict(min_clients=4), "a round samples 3 clients; give 1 to 3"),
    (dict(screen="median"), "screen='median'"),
    (dict(precision="int8", dp={"noise_multiplier": 1.0, "clipping_norm": 1.0}),
     "use precision='fp32'"),
    (dict(dp={"noise": 1.0}), "noise_multiplier"),
])
def test_a_fleet_run_refuses_bad_options_before_any_compile(change, message):
    from ubitrain.fleet.simulate import check_run

    run = dict(rounds=2, local_steps=2, fraction_train=1.0, strategy="fedavg", precision="fp32",
               rounding="nearest", clients=3, min_clients=None, screen="norm", dp=None,
               optimizer=ub.SGD(lr=0.1, momentum=0.9))
    with pytest.raises(ub.UbitrainError, match=message):
        check_run(**{**run, **change})


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


class BlobNet(torch.nn.Module):
    """Not the digits demo's: a small MLP with BatchNorm (whose statistics travel too)."""

    def __init__(self, features=12, classes=4):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(features, 16),
                                        torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.body(x))


def _blobs(n, seed, classes=4, features=12):
    """Gaussian blobs, one per class: (x float32, y int64)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).standard_normal((classes, features)) * 2
    y = rng.integers(0, classes, n)
    return (centres[y] + rng.standard_normal((n, features))).astype(np.float32), y


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    """The API with a model and data of the caller's own: three simulated clients of uneven
    shards, three rounds; client 1 crashes in round 2 (two of three answer: the round
    merges them), clients 0 and 2 in round 3 (one of three: fewer than a majority, the round
    fails)."""
    from ubitrain.fleet import run_fleet

    lines = []
    clients = [_blobs(n, seed) for n, seed in [(40, 1), (23, 2), (57, 3)]]
    result = run_fleet(BlobNet, clients, _blobs(64, 4), rounds=3, local_steps=2, batch=16,
                       progress=False, out_dir=tmp_path_factory.mktemp("fleet") / "run",
                       log=lines.append, faults={(1, 2), (0, 3), (2, 3)})
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
    replies = result.strategy.replies
    assert [len(replies[1]), len(replies[2])] == [3, 2]  # the crashed client is left out
    assert 3 not in replies  # the failed round merged nothing
    after_round_1 = np.load(result.out_dir / "checkpoints" / "round_001.npz")
    after_round_2 = np.load(result.out_dir / "checkpoints" / "round_002.npz")
    for round_, model in [(1, dict(after_round_1)), (2, dict(after_round_2))]:
        want = _torch_fedavg(replies[round_])
        assert sorted(want) == sorted(model)
        for k, v in want.items():
            np.testing.assert_array_equal(model[k], v, err_msg=f"round {round_}: {k}")


def test_what_a_client_sends_is_what_its_trainer_computed(fleet_run):
    """Round 1, redone in this process from the initial model with client 0's batches (its
    trainer loaded from the project's files, its shard from its own file): the update that
    crossed Flower's messages is the trainer's own, bit for bit."""
    from ubitrain.fleet.apps import client_shard, client_trainer
    from ubitrain.fleet.data import shard_file

    result, _ = fleet_run
    setup = result.setup
    trainer = client_trainer(setup)
    x, y = client_shard(shard_file(setup.data_dir, 0))
    assert len(x) == 40 and trainer.package.manifest["model_name"] == "host"
    initial = dict(np.load(result.out_dir / "checkpoints" / "round_000.npz"))
    update, _ = local_round(trainer, initial, x, y, setup.local, seed=setup.client_seed(0, 1))
    sent = [u for u, n in result.strategy.replies[1] if n == len(x)]
    assert any(all(np.array_equal(u[k], update[k]) for k in update) for u in sent)


def test_the_run_reports_each_round_and_ends_with_the_fleet_line(fleet_run):
    result, lines = fleet_run
    assert [m["failures"] for m in result.rounds[1:]] == [0, 1, 2]
    assert all(m["bytes_up"] > 0 and m["bytes_down"] > 0 for m in result.rounds[1:])
    assert lines[-1] == (f"fleet: 3 clients, 3 rounds, test accuracy "
                         f"{100 * result.accuracy:.1f}% (centralized "
                         f"{100 * result.central_accuracy:.1f}%)")
    assert sum(line.startswith("round ") for line in lines) == 3


def test_a_round_that_too_few_clients_answered_fails_and_the_model_stays(fleet_run):
    """Round 3: one of three clients answered, fewer than a majority: the round fails (its
    line says so), and the global model is round 2's, not client 1's update alone."""
    result, lines = fleet_run
    assert [bool(m.get("failed")) for m in result.rounds[1:]] == [False, False, True]
    assert "1 of 3 clients sent an update it could merge, at least 2 needed" in \
        result.rounds[3]["failed"]
    round_3 = next(line for line in lines if line.startswith("round 3/3"))
    assert "1/3 clients" in round_3 and "FAILED" in round_3
    assert any(line.startswith("warning: 1 of 3 rounds failed") for line in lines)
    after_2, after_3 = (np.load(result.out_dir / "checkpoints" / f"round_00{r}.npz")
                        for r in (2, 3))
    assert all(np.array_equal(after_2[k], after_3[k]) and
               np.array_equal(after_3[k], result.model[k]) for k in after_2.files)


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
    from harness import require_tools

    from ubitrain.fleet.deployment import run_deployment

    require_tools("cortex-m4")
    shards, test = digits_shards(2)
    out = tmp_path / "deploy"
    result = run_deployment(DigitsCNN, shards, test, rounds=3, local_steps=3,
                            emulated="cortex-m4", out_dir=out, log=lambda line: None,
                            kill=((0, 2),), min_clients=1, intruders=1)
    # TLS and SuperNode authentication: a SuperNode whose key nobody registered is refused
    assert result.refused == ["intruder-0"]
    superlink = (out / "logs" / "superlink.log").read_text()
    assert "running on https://127.0.0.1:" in superlink  # TLS, on the loopback
    assert "No SuperNode found with the given public key" in superlink
    rounds = result.rounds
    assert [m["round"] for m in rounds] == [0, 1, 2, 3]
    assert [(m["clients"], m["failures"], m["emulated"]) for m in rounds[1:]] == [
        (2, 0, 1), (2, 1, 1), (2, 0, 1)]
    assert rounds[3]["accuracy"] > rounds[0]["accuracy"]


# ---- what a client receives: the compiled project's files -------------------------------------


def test_a_project_copied_elsewhere_loads_builds_and_trains_the_same(digits_trainers, tmp_path):
    """ub.load_package on a copy of the project's files (C, weights.bin, package.json): a
    Package whose build() trains as the compiled package's trainer does, bit for bit."""
    pkg = digits_trainers(0.9)[0].package
    loaded = ub.load_package(copied_project(pkg, tmp_path / "elsewhere"))
    assert loaded.out_dir == (tmp_path / "elsewhere").resolve()
    assert (loaded.model_name, loaded.classes, loaded.trainable) == (
        pkg.model_name, pkg.classes, pkg.trainable)
    original, copy = pkg.build(), loaded.build()
    assert copy.library.parent.parent == loaded.out_dir  # built there, not at the original
    table = sorted((name, kind, np.dtype(dtype).name, list(shape))
                   for name, kind, dtype, shape, _ in copy.tensors)
    kinds = {"parameter": 0, "buffer": 1, "optimizer_state": 2}
    assert table == sorted((t["name"], kinds[t["kind"]], t["dtype"], t["shape"])
                           for t in loaded.manifest["tensors"])
    same_training(original, copy)


def test_a_project_missing_a_file_or_changed_is_refused(digits_trainers, tmp_path):
    pkg = digits_trainers(0.9)[0].package
    where = copied_project(pkg, tmp_path / "part")
    (where / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ub.UbitrainError, match="weights.bin.*copy the whole project again"):
        ub.load_package(where)
    (where / "package.json").unlink()
    with pytest.raises(ub.UbitrainError, match="holds no package.json"):
        ub.load_package(where)


def test_the_fleet_imports_neither_the_demo_nor_the_zoo_nor_the_cli():
    """The fleet is an API: the digits demo is the command line's use of it, and fleet/cli.py
    no longer imports ubitrain.cli (which imports it). Every import of every module of the
    package, at the top or inside a function, read from its source."""
    import ast
    from pathlib import Path

    import ubitrain.fleet

    imported = set()
    for path in Path(ubitrain.fleet.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = "ubitrain.fleet" if node.level == 1 else "ubitrain" \
                    if node.level == 2 else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                imported |= {module} | {f"{module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
    assert "ubitrain.fleet.simulate" in imported  # the walk sees relative imports
    assert not {m for m in imported for banned in ("ubitrain.demos", "ubitrain.zoo",
                                                   "ubitrain.cli")
                if m == banned or m.startswith(banned + ".")}


def test_a_clients_process_imports_neither_torch_nor_tvm():
    """Every Ray worker and deployed ClientApp process imports the client's apps and loads a
    compiled project: the compiler's torch and TVM (seconds each, per process) stay out."""
    import subprocess
    import sys

    code = ("import sys, ubitrain.fleet.apps, ubitrain.fleet.deployed_apps\n"
            "from ubitrain.api import load_package\n"
            "print(sorted({'torch', 'tvm'} & set(sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
