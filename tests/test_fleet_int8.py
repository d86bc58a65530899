"""The fleet's int8 (NITI) clients: integer FedAvg against its documented rule in exact
rationals, the int8 trainer's exchange of integer parameters, simulated and deployed runs
whose global model is the rule applied to the clients' updates, and an int8 project copied
elsewhere."""

import numpy as np
import pytest
import torch
from fleet_harness import copied_project, digits_shards, same_training

import ubitrain as ub


def _reference_int8_mean(updates, rounding, seed):
    """The documented merge (int8_exchange.py) in exact rationals: per element the
    sample-weighted mean of q_k * 2^e_k in units of 2^E (E the largest exponent), rounded
    half to even (Python's round of a Fraction), or up with probability frac * D, where u is
    numpy's default_rng(seed).integers(0, D) per weight in sorted name order and D = N * 2^(E
    - min e_k)."""
    import math
    from fractions import Fraction

    total = sum(n for _, n in updates)
    rng = np.random.default_rng(seed)
    merged = {}
    for name in sorted(k for k in updates[0][0] if not k.endswith(".exponent")):
        exps = [int(u[name + ".exponent"][0]) for u, _ in updates]
        top, lo = max(exps), min(exps)
        divisor = total * 2 ** (top - lo)
        shape = updates[0][0][name].shape
        draws = rng.integers(0, divisor, size=shape, dtype=np.int64).reshape(-1) \
            if rounding == "stochastic" else None
        out = []
        for i in range(int(np.prod(shape))):
            x = sum(Fraction(int(u[name].reshape(-1)[i]) * n) * Fraction(2) ** e
                    for (u, n), e in zip(updates, exps)) / total / Fraction(2) ** top
            if rounding == "nearest":
                out.append(round(x))
            else:
                low = math.floor(x)
                out.append(low + int(draws[i] < (x - low) * divisor))
        merged[name] = np.array(out, np.int64).reshape(shape)
        merged[name + ".exponent"] = np.array([top])
    return merged


def _int8_updates(rng, exponents, counts, shapes, dtype=np.int8):
    top = np.iinfo(dtype).max
    return [({**{f"w{j}": rng.integers(-top, top + 1, shape).astype(dtype)
                 for j, shape in enumerate(shapes)},
              **{f"w{j}.exponent": np.array([e[j]], np.int32) for j in range(len(shapes))}}, n)
            for e, n in zip(exponents, counts)]


@pytest.mark.parametrize("dtype", [np.int8, np.int32], ids=["int8_weights", "int32_biases"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("exponents, counts", [
    ([(-9, 0)] * 2, [1, 1]),                        # one exponent, halves: ties
    ([(-9, -3), (-7, -3), (-9, -5)], [13, 1, 40]),  # exponents differ, uneven samples
    ([(4, -20)] * 4, [3, 3, 3, 3]),
])
def test_integer_fedavg_is_the_documented_rule_bit_for_bit(rounding, exponents, counts, dtype):
    from ubitrain.fleet.int8_exchange import integer_fedavg

    rng = np.random.default_rng(len(counts))
    updates = _int8_updates(rng, exponents, counts, [(6, 5), (17,)], dtype)
    bottom = -np.iinfo(dtype).max
    updates[0][0]["w1"][:] = bottom  # the extremes stay within the type without clipping
    updates[-1][0]["w1"][:] = bottom
    got = integer_fedavg(updates, rounding, seed=(7, 3))
    want = _reference_int8_mean(updates, rounding, (7, 3))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == (dtype if not k.endswith("exponent") else np.int32), k
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    if len(counts) == 2:  # the ties: half of the odd sums round down to even
        odd = (updates[0][0]["w0"].astype(int) + updates[1][0]["w0"]) % 2 == 1
        assert odd.any() and (got["w0"][odd] % 2 == 0).all() == (rounding == "nearest")


def test_integer_fedavg_refuses_float_replies_and_mixed_weights():
    from ubitrain.fleet.int8_exchange import integer_fedavg

    rng = np.random.default_rng(0)
    good = _int8_updates(rng, [(0,)] * 2, [1, 2], [(3,)])
    with pytest.raises(ub.UbitrainError, match="int8 fleet exchanges int8 weights"):
        integer_fedavg([good[0], ({"w0": np.zeros(3, np.float32),
                                   "w0.exponent": np.array([0], np.int32)}, 1)])
    with pytest.raises(ub.UbitrainError, match="same weights"):
        integer_fedavg([good[0], ({"w0": np.zeros(3, np.int8)}, 1)])
    with pytest.raises(ub.UbitrainError, match=r"shape \[4\], reply 0 of shape \[3\]"):
        integer_fedavg([good[0], ({"w0": np.zeros(4, np.int8),
                                   "w0.exponent": np.array([0], np.int32)}, 1)])
    with pytest.raises(ub.UbitrainError, match="rounding='floor'"):
        integer_fedavg(good, "floor")


@pytest.fixture(scope="module")
def int8_trainers(tmp_path_factory):
    """Two trainers of the int8 digits CNN (NITI, no BatchNorm or biases), batch 8."""
    from ubitrain.zoo import DigitsCNNNiti

    torch.manual_seed(0)
    pkg = ub.compile(DigitsCNNNiti(), (torch.randn(8, 1, 8, 8),),
                     torch.zeros(8, dtype=torch.long), precision="int8", progress=False,
                     optimizer=ub.NITI(mu=(5, 3), milestones=(4,)),
                     out_dir=tmp_path_factory.mktemp("fleet") / "int8")
    a, b = pkg.build(), pkg.build()
    yield pkg, a, b
    a.close()
    b.close()


def test_the_int8_trainer_loads_what_it_gives_exactly(int8_trainers):
    pkg, a, b = int8_trainers
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    for _ in range(3):
        a.step(x, rng.integers(0, 10, 8))
    sent = a.int8_parameters()
    assert {k: v.dtype for k, v in sent.items()} == {
        k: np.int8 if not k.endswith(".exponent") else np.int32
        for name in pkg.integer_parameters for k in (name, name + ".exponent")}
    # b's exponents moved: int8 weights with their exponents still load exactly
    b.load_parameters({k: v + 2 for k, v in sent.items() if k.endswith(".exponent")})
    b.load_parameters(sent)
    got = b.int8_parameters()
    assert all(np.array_equal(got[k], v) for k, v in sent.items())
    assert np.array_equal(a.predict(x), b.predict(x))
    # floats q * 2^e: back to the same int8, at the current or at a given exponent
    b.load_parameters({k: v + 1 for k, v in sent.items() if k.endswith(".exponent")})
    b.load_parameters({**a.parameters(), **{k: v for k, v in sent.items()
                                            if k.endswith(".exponent")}})
    assert all(np.array_equal(b.int8_parameters()[k], v) for k, v in sent.items())
    b.load_parameters(a.parameters())
    assert all(np.array_equal(b.int8_parameters()[k], v) for k, v in sent.items())
    with pytest.raises(ub.InputError, match="unknown parameter names"):
        b.load_parameters({"nope.exponent": np.array([0])})
    with pytest.raises(ub.InputError, match="one integer"):
        b.load_parameters({"classifier.weight.exponent": np.array([0.5])})


def test_a_client_resets_the_niti_state_at_the_fleets_step_count(int8_trainers):
    """reset_optimizer_state(step): the next step uses mu at that step count, as NITI's
    numpy reference does from there (mu 5 before step 4, 3 from it)."""
    from ubitrain.fidelity.niti_check import compare_with_reference
    from ubitrain.zoo import DigitsCNNNiti

    pkg, a, _ = int8_trainers
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    start = a.int8_parameters()
    trained = []
    for step in (0, 6):
        a.load_parameters(start)
        a.reset_optimizer_state(step=step)
        run = compare_with_reference(a, DigitsCNNNiti(), [(x, y)], pkg.config, first_step=step)
        assert run.differences == [] and run.moved > 0
        assert a.steps == step + 1
        trained.append(a.int8_parameters()["classifier.weight"])
    assert not np.array_equal(*trained)  # mu 5, then 3: other steps


@pytest.fixture(scope="module")
def int8_fleet_run(tmp_path_factory):
    """Three int8 clients of the digits, two rounds of three local steps."""
    from ubitrain.fleet import run_fleet
    from ubitrain.zoo import DigitsCNNNiti

    lines = []
    shards, test = digits_shards(3)
    result = run_fleet(DigitsCNNNiti, shards, test, rounds=2, local_steps=3, batch=16,
                       progress=False, precision="int8",
                       out_dir=tmp_path_factory.mktemp("fleet") / "int8run", log=lines.append)
    return result, lines


def test_the_int8_servers_model_is_the_rule_applied_to_the_clients_updates(int8_fleet_run):
    result, lines = int8_fleet_run
    replies = result.strategy.replies
    checkpoints = [dict(np.load(result.out_dir / "checkpoints" / f"round_{r:03d}.npz"))
                   for r in range(3)]
    assert [int(c["niti.step"][0]) for c in checkpoints] == [0, 9, 18]
    for round_ in (1, 2):
        assert len(replies[round_]) == 3
        want = _reference_int8_mean(replies[round_], "nearest", None)
        model = checkpoints[round_]
        assert sorted(want) == sorted(k for k in model if k != "niti.step")
        for k, v in want.items():
            np.testing.assert_array_equal(model[k], v, err_msg=f"round {round_}: {k}")
        # NITI trains the int8 values; no exponent moves
        assert all(np.array_equal(model[k], checkpoints[0][k]) for k in model
                   if k.endswith(".exponent"))
    assert any(not np.array_equal(checkpoints[2][k], checkpoints[0][k]) for k in want)
    assert lines[-1] == (f"fleet: 3 clients, 2 rounds, test accuracy "
                         f"{100 * result.accuracy:.1f}% (centralized "
                         f"{100 * result.central_accuracy:.1f}%)")


def test_an_int8_client_trains_from_the_global_model_at_the_fleets_step(int8_fleet_run):
    """Round 2, redone in this process from round 1's global model with client 1's batches:
    the update that crossed Flower's messages is the trainer's own, and the trainer's step
    counter went on from the fleet's 9 steps."""
    from ubitrain.fleet.apps import client_shard, client_trainer
    from ubitrain.fleet.data import shard_file
    from ubitrain.fleet.int8_exchange import int8_local_round

    result, _ = int8_fleet_run
    setup = result.setup
    trainer = client_trainer(setup)
    x, y = client_shard(shard_file(setup.data_dir, 1))
    global_model = dict(np.load(result.out_dir / "checkpoints" / "round_001.npz"))
    update, _ = int8_local_round(trainer, global_model, x, y, setup.local,
                                 seed=setup.client_seed(1, 2))
    assert trainer.steps == 9 + 3
    sent = [u for u, _ in result.strategy.replies[2]]
    assert sum(all(np.array_equal(u[k], update[k]) for k in update) for u in sent) == 1


def test_int8_fleet_refuses_sgd_options():
    """--lr and --momentum set SGD's step; int8 clients run NITI's update, which has neither:
    given with --precision int8 they are an error, not silently ignored."""
    from ubitrain.cli import main

    with pytest.raises(SystemExit, match="--lr and --momentum"):
        main(["fleet", "--precision", "int8", "--lr", "0.1", "--momentum", "0"])


def test_int8_clients_under_the_deployment_engine(tmp_path):
    """The same int8 apps on real SuperNode processes: the global model stays int8 at the
    initial exponents, and its NITI step count is what the fleet ran."""
    from ubitrain.fleet.deployment import run_deployment
    from ubitrain.zoo import DigitsCNNNiti

    out = tmp_path / "deploy"
    shards, test = digits_shards(2)
    rounds = run_deployment(DigitsCNNNiti, shards, test, rounds=1, local_steps=2, out_dir=out,
                            log=lambda line: None, precision="int8").rounds
    assert [(m["round"], m.get("clients"), m.get("failures")) for m in rounds] == [
        (0, None, None), (1, 2, 0)]
    start, end = (np.load(out / "checkpoints" / f"round_00{r}.npz") for r in (0, 1))
    assert int(end["niti.step"][0]) == 2 * 2
    weights = [k for k in end.files if k != "niti.step" and not k.endswith(".exponent")]
    assert weights and all(end[k].dtype == np.int8 for k in weights)
    assert any((end[k] != start[k]).any() for k in weights)  # the round trained
    assert all((end[k] == start[k]).all() for k in end.files if k.endswith(".exponent"))


def test_an_int8_project_copied_elsewhere_trains_the_same(int8_trainers, tmp_path):
    pkg = int8_trainers[0]
    loaded = ub.load_package(copied_project(pkg, tmp_path / "int8"))
    assert loaded.precision == "int8" and loaded.config == pkg.config
    assert loaded.integer_parameters == pkg.integer_parameters
    with pkg.build() as original, loaded.build() as copy:
        same_training(original, copy)
        want, got = original.int8_state(), copy.int8_state()
        assert sorted(got) == sorted(want)
        assert all(np.array_equal(got[k], v) for k, v in want.items())
