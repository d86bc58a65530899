"""`run_fleet`: a fleet of ubitrain clients on one machine under Flower's simulation engine,
and the same model trained centrally on the same number of samples, for comparison."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from ..demos.data import accuracy, predict_padded
from ..errors import UbitrainError
from ..progress import bar
from .apps import STRATEGIES, FleetSetup, ServerPlan, client_app, open_trainer, server_app
from .data import digits_fleet
from .int8_exchange import ROUNDINGS, exchanged_int8_names, initial_int8_model, without_step
from .local import LocalTraining, batch_indices, exchanged_names
from .packages import fleet_package


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def test_metrics(trainer, x_test, y_test, tensors=None) -> dict:
    """Test accuracy and loss of `trainer`, after loading `tensors` if given."""
    if tensors is not None:
        trainer.load_parameters(tensors)
    logits = predict_padded(trainer.predict, x_test, trainer.package.inputs[0].shape[0])
    return {"accuracy": accuracy(logits, y_test), "loss": cross_entropy(logits, y_test)}


def _check(rounds, local_steps, fraction_fit, strategy, momentum, precision, rounding):
    if rounds < 1 or local_steps < 1:
        raise UbitrainError(f"--rounds {rounds} --local-steps {local_steps}: give at least one "
                            "round of at least one local step")
    if not 0 < fraction_fit <= 1:
        raise UbitrainError(f"--fraction-fit {fraction_fit}: give a fraction of the clients "
                            "in (0, 1]")
    if strategy not in STRATEGIES:
        raise UbitrainError(f"--strategy {strategy!r}: choose one of {sorted(STRATEGIES)}")
    if precision not in ("fp32", "int8"):
        raise UbitrainError(f"--precision {precision!r}: choose fp32 or int8")
    if precision == "int8" and strategy != "fedavg":
        raise UbitrainError(f"--precision int8 merges int8 weights with the exact integer "
                            f"FedAvg; --strategy {strategy} computes in floats on the server: "
                            "use --strategy fedavg")
    if rounding not in ROUNDINGS:
        raise UbitrainError(f"--int8-rounding {rounding!r}: choose one of "
                            f"{', '.join(ROUNDINGS)}")
    if strategy == "fedprox" and momentum:
        raise UbitrainError("FedProx's proximal step is exact for plain SGD only: use "
                            "--momentum 0 with --strategy fedprox")


def clients_per_round(clients: int, fraction_fit: float) -> int:
    return max(int(clients * fraction_fit), 1)  # as Flower's strategies sample


def run_fleet(clients: int = 20, rounds: int = 8, local_steps: int = 10, batch: int = 16,
              lr: float = 0.05, momentum: float = 0.9, strategy: str = "fedavg",
              fraction_fit: float = 1.0, non_iid: float | None = None, sparse: bool = False,
              proximal_mu: float = 0.01, out_dir="build/fleet", seed: int = 0,
              progress: bool | None = None, log=print, faults=(), verbose: bool = False,
              model=None, target: str = "host", precision: str = "fp32",
              rounding: str = "nearest") -> dict:
    """Federated training of `model()` (default: the demo's digits CNN) over `clients`
    simulated clients, each training the generated C step on its own shard (built for
    `target`: another than the host runs under its emulator, one per worker), against
    central training on as many samples. The result: per-round metrics of both, the final
    accuracies, the global model, and the strategy (with the last round's replies).
    precision="int8": NITI clients (the CNN without BatchNorm and biases by default, mu
    5, 4, 3 over the thirds of the steps), merged by the exact integer FedAvg with
    `rounding` (int8_exchange.py); lr and momentum do not apply."""
    _check(rounds, local_steps, fraction_fit, strategy, momentum, precision, rounding)
    from flwr.simulation import run_simulation

    start = time.perf_counter()
    out_dir = Path(out_dir).resolve()
    shards, (x_test, y_test) = digits_fleet(clients, non_iid, seed)
    steps = clients_per_round(clients, fraction_fit) * local_steps  # the fleet's, a round
    compiled = dict(model=model, batch=batch, sample_shape=x_test.shape[1:], lr=lr,
                    momentum=momentum, sparse=sparse, seed=seed, progress=progress,
                    precision=precision)
    if precision == "int8":
        from ..demos.int8 import niti_config
        compiled["niti"] = niti_config(steps * rounds, adaptive=False)
    package_file, evaluator = fleet_package(out_dir, "host", **compiled)  # the server's
    library = evaluator.library
    if target != "host":  # the clients run the target's build under its emulator
        package_file, device = fleet_package(out_dir, target, **compiled)
        device.close()
    if precision == "int8":
        initial = initial_int8_model(evaluator, exchanged_int8_names(evaluator, sparse))
    else:
        names = exchanged_names(evaluator, sparse)
        initial = {k: v for k, v in evaluator.parameters().items() if k in names}
    setup = FleetSetup(package_file, library if target == "host" else None, clients, non_iid,
                       seed, LocalTraining(local_steps, batch, lr), frozenset(faults))

    split = "IID" if non_iid is None else f"Dirichlet alpha {non_iid}"
    sizes = [len(s[1]) for s in shards]
    log(f"ubitrain fleet: {clients} clients ({split}, {min(sizes)}-{max(sizes)} images each), "
        f"{rounds} rounds of {local_steps} local steps (batch {batch}) on "
        f"{clients_per_round(clients, fraction_fit)} clients, "
        + (f"int8 (NITI), integer FedAvg ({rounding} rounding), " if precision == "int8"
           else f"{strategy}, ")
        + f"{'sparse' if sparse else 'full'} update ({sum(v.nbytes for v in initial.values())} B)"
        + ("" if target == "host" else f", clients on {target} under its emulator"))
    rounds_bar = bar(range(rounds), "fleet", progress, unit="round")

    def report(server_round, tensors):
        tensors = without_step(tensors) if precision == "int8" else tensors
        metrics = {"round": server_round, **test_metrics(evaluator, x_test, y_test, tensors)}
        if server_round:
            rounds_bar.update(1)
        return metrics

    def printed(m):
        on_boards = f" ({m['emulated']} on {target})" if m["emulated"] else ""
        log(f"round {m['round']}/{rounds}: test accuracy {100 * m['accuracy']:.1f}%, loss "
            f"{m['loss']:.3f}, {m['clients'] - m['failures']}/{m['clients']} clients"
            f"{on_boards}, up {m['bytes_up'] / 1e3:.1f} kB, down {m['bytes_down'] / 1e3:.1f} "
            f"kB, {m['seconds']:.1f} s")

    plan = ServerPlan(strategy, rounds, fraction_fit, initial, report, out_dir / "checkpoints",
                      strategy_args={"proximal_mu": proximal_mu} if strategy == "fedprox"
                      else {"eta": 0.01} if strategy == "fedadam"
                      else {"rounding": rounding, "seed": seed} if precision == "int8" else {},
                      seed=seed, on_round=printed, precision=precision)
    if not verbose:  # Flower's deprecation notes and Ray's tips, not ours to act on
        logging.getLogger("flwr").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    run_simulation(server_app(plan, clients), client_app(setup), num_supernodes=clients,
                   backend_config={"client_resources": {"num_cpus": 1},
                                   "init_args": {"logging_level": logging.ERROR,
                                                 "log_to_driver": verbose}})
    rounds_bar.close()
    fleet = plan.result.get("rounds", [])
    if len(fleet) != rounds + 1:
        raise UbitrainError(f"the simulation stopped after {max(len(fleet) - 1, 0)} of {rounds} "
                            "rounds; rerun with --verbose to see Flower's log")

    # central training: one trainer on all the shards, as many steps as the fleet took
    central_trainer = open_trainer(evaluator.package, library, seed)
    x_all = np.concatenate([s[0] for s in shards])
    y_all = np.concatenate([s[1] for s in shards])
    order = batch_indices(len(x_all), steps * rounds, batch, np.random.default_rng(seed))
    central = [test_metrics(central_trainer, x_test, y_test)]
    for r in range(rounds):
        for idx in order[r * steps:(r + 1) * steps]:
            central_trainer.step(x_all[idx], y_all[idx])
        central.append(test_metrics(central_trainer, x_test, y_test))

    result = {"rounds": fleet, "central": central, "accuracy": fleet[-1]["accuracy"],
              "central_accuracy": central[-1]["accuracy"], "model": plan.result["model"],
              "strategy": plan.result["strategy"], "setup": setup, "out_dir": str(out_dir),
              "plot": str(plot(fleet, central, out_dir / "accuracy.png")),
              "seconds": time.perf_counter() - start}
    log(f"global model checkpoints in {out_dir / 'checkpoints'}, accuracy per round in "
        f"{result['plot']}, {result['seconds']:.0f} s in all")
    log(f"fleet: {clients} clients, {rounds} rounds, test accuracy "
        f"{100 * result['accuracy']:.1f}% (centralized {100 * result['central_accuracy']:.1f}%)")
    return result


def plot(fleet: list[dict], central: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([m["round"] for m in fleet], [100 * m["accuracy"] for m in fleet], "o-",
            label="fleet (federated)")
    ax.plot(range(len(central)), [100 * m["accuracy"] for m in central], "s--",
            label="centralized, same samples")
    ax.set(xlabel="round", ylabel="test accuracy (%)", ylim=(0, 100),
           title="digits CNN trained in generated C")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
