"""`run_fleet`: federated training of any model over any clients' data, on one machine under
Flower's simulation engine, and the same model trained centrally on the same number of
samples, for comparison.

    from ubitrain.fleet import run_fleet
    result = run_fleet(lambda: MyNet(), [(x0, y0), (x1, y1), ...], (x_test, y_test),
                       optimizer=ub.SGD(lr=0.05, momentum=0.9), rounds=8, strategy="fedavg")
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from flwr.serverapp.strategy import FedAvg, FedProx

from ..errors import UbitrainError
from ..progress import bar
from ..targets import get_target
from .apps import FleetSetup, client_app
from .evaluation import model_metrics
from .int8_exchange import ROUNDINGS, without_step
from .local import batch_indices
from .lock import out_dir_lock
from .packages import open_trainer
from .prepare import concatenated, prepare
from .result import FleetResult
from .screening import SCREENS
from .server import ServerPlan, check_outcome, server_app, strategy_class

STRATEGY_DEFAULTS = {"fedprox": {"proximal_mu": 0.01}, "fedadam": {"eta": 0.01}}


def clients_per_round(clients: int, fraction_train: float) -> int:
    return max(int(clients * fraction_train), 1)  # as Flower's strategies sample


def check_run(rounds, local_steps, fraction_train, strategy, precision, rounding,
              clients=None, min_clients=None, screen="norm", dp=None, optimizer=None):
    """The strategy's class, after checking the run's numbers and their combination."""
    if rounds < 1 or local_steps < 1:
        raise UbitrainError(f"rounds={rounds}, local_steps={local_steps}: give at least one "
                            "round of at least one local step")
    if not 0 < fraction_train <= 1:
        raise UbitrainError(f"fraction_train={fraction_train}: give a fraction of the clients "
                            "in (0, 1]")
    cls = strategy_class(strategy)
    if precision == "int8" and cls is not FedAvg:
        raise UbitrainError(f"precision='int8' merges int8 weights with the exact integer "
                            f"FedAvg; strategy {cls.__name__} computes in floats on the "
                            "server: use strategy='fedavg'")
    if rounding not in ROUNDINGS:
        raise UbitrainError(f"rounding={rounding!r}: choose one of {', '.join(ROUNDINGS)}")
    if issubclass(cls, FedProx) and (optimizer is None or getattr(optimizer, "momentum", 0)):
        raise UbitrainError("FedProx's proximal step is exact for plain SGD only: use "
                            "optimizer=ub.SGD(lr, momentum=0) (--momentum 0) with FedProx")
    if screen not in SCREENS:
        raise UbitrainError(f"screen={screen!r}: choose one of {SCREENS} (screening.py)")
    per_round = clients_per_round(clients, fraction_train) if clients else None
    if min_clients is not None and (min_clients < 1 or (per_round and min_clients > per_round)):
        raise UbitrainError(f"min_clients={min_clients}: a round samples {per_round} clients; "
                            f"give 1 to {per_round} (default: a majority of them)")
    if dp is not None:
        if precision == "int8":
            raise UbitrainError("dp: Flower's clipping and noise compute in floats; int8 "
                                "clients exchange int8 weights: use precision='fp32'")
        if not isinstance(dp, dict) or set(dp) != {"noise_multiplier", "clipping_norm"}:
            raise UbitrainError(f"dp={dp!r}: give {{'noise_multiplier': z, 'clipping_norm': "
                                "c}} (Flower's central DP with client-side fixed clipping)")
    return cls


def strategy_arguments(strategy, strategy_args, precision, rounding, seed) -> dict:
    if precision == "int8":
        return {"rounding": rounding, "seed": seed}
    defaults = STRATEGY_DEFAULTS.get(strategy, {}) if isinstance(strategy, str) else {}
    return {**defaults, **(strategy_args or {})}


def run_fleet(model_factory, client_data, test_data=None, *, optimizer=None, rounds: int = 8,
              local_steps: int = 10, batch: int = 16, strategy="fedavg",
              strategy_args: dict | None = None, fraction_train: float = 1.0,
              sparse: bool = False, target: str = "host", precision: str = "fp32",
              rounding: str = "nearest", min_clients: int | None = None,
              screen: str | None = "norm", dp: dict | None = None, central: bool = True,
              out_dir="build/fleet", seed: int = 0, progress: bool | None = None, log=print,
              verbose: bool = False, faults=()) -> FleetResult:
    """Federated training of `model_factory()` (a function returning a new torch.nn.Module;
    called under `seed`, so every compile starts from the same weights) over one simulated
    client per `(x, y)` of `client_data` (float samples, int64 class labels), evaluated on
    `test_data` after every round.

    Each round the server sends the global model to `fraction_train` of the clients; each
    takes `local_steps` steps of `optimizer` in the generated C (compiled at `batch`, for
    `target`: another than the host runs under its emulator) on its own shard, restarting
    the optimizer, and the server merges the updates with `strategy` ("fedavg", "fedprox",
    "fedadam", or a Flower strategy class derived from FedAvg), built with
    `strategy_args`. `sparse`: train and exchange only the biases and the last layer.
    `precision="int8"`: NITI clients (optimizer a ub.NITI, default mu 5, 4, 3 over the
    thirds of the fleet's steps), merged by the exact integer FedAvg with `rounding`
    (int8_exchange.py). A round fails when fewer than `min_clients` (default: a majority of
    the sampled clients) sent an update that `screen` lets in (screening.py: "norm" refuses
    non-finite updates and those far larger than the others'); a run whose every round
    failed raises. `dp={"noise_multiplier": z, "clipping_norm": c}`: Flower's central
    differential privacy with client-side clipping. `central`: train the same model
    centrally on as many samples, the yardstick. `faults`: (client, round) pairs where a
    client crashes, or {(client, round): "crash", "nan", "inf" or "huge"} (tests). The
    global model is checkpointed after every round in `out_dir/checkpoints`; one run an
    out_dir at a time."""
    clients = len(client_data) if isinstance(client_data, (list, tuple)) else 0
    cls = check_run(rounds, local_steps, fraction_train, strategy, precision, rounding,
                    clients, min_clients, screen, dp, optimizer)
    out_dir = Path(out_dir).resolve()
    with out_dir_lock(out_dir):
        return _run_fleet(cls, model_factory, client_data, test_data, optimizer, rounds,
                          local_steps, batch, strategy, strategy_args, fraction_train, sparse,
                          target, precision, rounding, min_clients, screen, dp, central,
                          out_dir, seed, progress, log, verbose, faults)


def _run_fleet(cls, model_factory, client_data, test_data, optimizer, rounds, local_steps,
               batch, strategy, strategy_args, fraction_train, sparse, target, precision,
               rounding, min_clients, screen, dp, central, out_dir, seed, progress, log,
               verbose, faults) -> FleetResult:
    start = time.perf_counter()
    clients = len(client_data)
    per_round = clients_per_round(clients, fraction_train)
    steps = per_round * local_steps  # the fleet's, a round
    prep = prepare(model_factory, client_data, test_data, out_dir=out_dir, target=target,
                   precision=precision, optimizer=optimizer, batch=batch,
                   local_steps=local_steps, sparse=sparse, seed=seed, progress=progress,
                   total_steps=steps * rounds)
    evaluator, test = prep.evaluator, prep.test
    setup = FleetSetup(prep.client_project, prep.client_library, prep.data_dir, seed,
                       prep.local, dict(faults) if isinstance(faults, dict) else frozenset(faults))
    sizes = [len(y) for _, y in prep.shards]
    log(f"ubitrain fleet: {clients} clients ({min(sizes)}-{max(sizes)} samples each), "
        f"{rounds} rounds of {local_steps} local steps (batch {batch}) on {per_round} "
        "clients, "
        + (f"int8 (NITI), integer FedAvg ({rounding} rounding), " if precision == "int8"
           else f"{cls.__name__}, ")
        + f"{'sparse' if sparse else 'full'} update "
        + f"({sum(v.nbytes for v in prep.initial.values())} B)"
        + ("" if dp is None else f", differential privacy (noise {dp['noise_multiplier']}, "
           f"clipping {dp['clipping_norm']})")
        + ("" if get_target(target).runs_on_host else
           f", clients on {target} under its emulator"))
    rounds_bar = bar(range(rounds), "fleet", progress, unit="round")

    def report(server_round, tensors):
        tensors = without_step(tensors) if precision == "int8" else tensors
        metrics = {"round": server_round, **model_metrics(evaluator, test, tensors)}
        if server_round:
            rounds_bar.update(1)
        return metrics

    def printed(m):
        log(round_line(m, rounds, target))

    plan = ServerPlan(strategy, rounds, fraction_train, prep.initial, report,
                      out_dir / "checkpoints",
                      strategy_args=strategy_arguments(strategy, strategy_args, precision,
                                                       rounding, seed),
                      seed=seed, on_round=printed, precision=precision,
                      min_clients=min_clients, screen=screen, dp=dp)
    try:
        simulate(plan, setup, clients, verbose)
    finally:
        rounds_bar.close()
    fleet = plan.result.get("rounds", [])
    if len(fleet) != rounds + 1:
        raise UbitrainError(f"the simulation stopped after {max(len(fleet) - 1, 0)} of {rounds} "
                            "rounds; rerun with --verbose to see Flower's log")
    check_outcome(fleet, log)
    yardstick = None
    if central and test is not None:
        yardstick = central_training(prep, batch, steps, rounds, seed)
    result = FleetResult(fleet, plan.result["model"], out_dir, 0.0, central=yardstick,
                         strategy=plan.result["strategy"], setup=setup)
    if test is not None:
        result.plot = plot(fleet, yardstick, out_dir / "accuracy.png", prep.model_name)
    result.seconds = time.perf_counter() - start
    log(f"global model checkpoints in {out_dir / 'checkpoints'}"
        + (f", accuracy per round in {result.plot}" if result.plot else "")
        + f", {result.seconds:.0f} s in all")
    log(result.summary(clients))
    return result


def round_line(m: dict, rounds: int, target: str) -> str:
    """A round's line: test metrics, clients, bytes, seconds; what failed, if it did."""
    on_boards = f" ({m['emulated']} on {target})" if m["emulated"] else ""
    tested = (f"test accuracy {100 * m['accuracy']:.1f}%, loss {m['loss']:.3f}, "
              if "accuracy" in m else "")
    refused = f", {m['refused']} refused" if m.get("refused") else ""
    line = (f"round {m['round']}/{rounds}: {tested}{m['clients'] - m['failures']}/"
            f"{m['clients']} clients{on_boards}{refused}, up {m['bytes_up'] / 1e3:.1f} kB, "
            f"down {m['bytes_down'] / 1e3:.1f} kB, {m['seconds']:.1f} s")
    if m.get("failed"):
        line += f"; FAILED: {m['failed']}; the global model stays"
    return line


@contextmanager
def ray_on_loopback():
    """Ray's servers on 127.0.0.1 only. Ray advertises, and binds its servers to, its node's
    address, by default the machine's outward one; with Ray's multi-node clusters switched
    off (the variable below, read when ray is imported; the constant, if it already is) the
    node is the loopback. Restored afterwards."""
    name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env = os.environ.get(name)
    constants = sys.modules.get("ray._private.ray_constants")
    saved = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[name] = "0"
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = saved


def simulate(plan: ServerPlan, setup: FleetSetup, clients: int, verbose: bool) -> None:
    """Flower's simulation engine over the plan's rounds. Ctrl-C stops it: the server stops
    waiting for replies, Ray shuts down, and Flower's threads are let end before the
    KeyboardInterrupt goes on (else the interpreter waits on them at exit)."""
    if not verbose:  # Flower's deprecation notes and Ray's tips, not ours to act on
        logging.getLogger("flwr").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    plan.stop = threading.Event()
    with ray_on_loopback():
        from flwr.simulation import run_simulation

        try:
            run_simulation(server_app(plan, clients), client_app(setup),
                           num_supernodes=clients,
                           backend_config={"client_resources": {"num_cpus": 1},
                                           "init_args": {"logging_level": logging.ERROR,
                                                         "log_to_driver": verbose,
                                                         "include_dashboard": False}})
        except KeyboardInterrupt:
            plan.stop.set()
            wind_down()
            raise


def wind_down(seconds: float = 20.0) -> None:
    """After Ctrl-C: Ray shut down, and every other thread given `seconds` to end."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    deadline = time.monotonic() + seconds
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(deadline - time.monotonic(), 0.0))


def central_training(prep, batch: int, steps: int, rounds: int, seed: int) -> list[dict]:
    """One trainer on all the shards, as many steps as the fleet took; test metrics after
    each round's worth."""
    trainer = open_trainer(prep.evaluator.package, prep.evaluator.library, seed)
    x_all, y_all = concatenated(prep.shards)
    order = batch_indices(len(x_all), steps * rounds, batch, np.random.default_rng(seed))
    central = [model_metrics(trainer, prep.test)]
    for r in range(rounds):
        for idx in order[r * steps:(r + 1) * steps]:
            trainer.step(x_all[idx], y_all[idx])
        central.append(model_metrics(trainer, prep.test))
    return central


def plot(fleet: list[dict], central: list[dict] | None, path: Path, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([m["round"] for m in fleet], [100 * m["accuracy"] for m in fleet], "o-",
            label="fleet (federated)")
    if central:
        ax.plot(range(len(central)), [100 * m["accuracy"] for m in central], "s--",
                label="centralized, same samples")
    ax.set(xlabel="round", ylabel="test accuracy (%)", ylim=(0, 100),
           title=f"{name} trained in generated C")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
