"""Flower's apps around ubitrain trainers: a ClientApp whose training is the generated C
step, and a ServerApp that merges the clients' updates with one of Flower's strategies.

The same two apps run under Flower's simulation engine (simulate.py) and its deployment
engine (a SuperLink and SuperNodes). A simulation worker keeps one trainer and the shards
for all the rounds and virtual clients it serves: a client's state is the global model,
loaded at the start of each round, so nothing of it lives in the trainer between rounds.
An int8 package's clients exchange int8 weights, merged exactly by Int8FedAvg
(int8_exchange.py).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx

from .data import digits_fleet
from .int8_exchange import Int8FedAvg, int8_local_round, is_int8
from .local import LocalTraining, local_round
from .records import as_numpy, as_record

STRATEGIES = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam}


@dataclass(frozen=True)
class FleetSetup:
    """What every process of the fleet needs to rebuild its part, picklable: the compiled
    package (pickled next to its built library), the data split, the local training."""

    package_file: Path
    library: Path | None  # None: the package's target under its emulator
    clients: int
    non_iid: float | None
    seed: int
    local: LocalTraining
    faults: frozenset = field(default_factory=frozenset)  # (client, round): fails there
    kill_on_fault: bool = False  # the client's process dies (SIGKILL) instead of raising

    def client_seed(self, client: int, server_round: int) -> int:
        """The seed of a client's batches in a round."""
        return self.seed * 1_000_003 + server_round * 1009 + client


class ClientCrash(RuntimeError):
    """A client made to fail mid-round (fault tests): the round must go on without it. (A
    simulated client whose Ray worker is killed takes Flower 1.42's Ray backend down with
    it for the rounds that follow; process kills are for the deployment engine.)"""


_PROCESS_STATE: dict = {}  # per process: the trainer and the shards, built once


def open_trainer(package, library: Path | None, seed: int):
    """A trainer of `package`: its host `library` loaded, or (None) the package's target
    started under its emulator; an int8 package's behind its Int8Trainer."""
    if library:
        from ..runtime.host_trainer import HostTrainer
        trainer = HostTrainer(library, package, seed=seed)
    else:
        from ..runtime.target_build import start_trainer
        from ..targets import get_target
        trainer = start_trainer(package, get_target(package.target), seed=seed,
                                progress=False)
    if getattr(package, "precision", "fp32") == "int8":
        from ..int8.trainer import Int8Trainer
        trainer = Int8Trainer(trainer, package)
    return trainer


def trainer_and_shards(setup: FleetSetup):
    """This process's trainer and the shards, made once."""
    if setup not in _PROCESS_STATE:
        package = pickle.loads(Path(setup.package_file).read_bytes())
        shards, _ = digits_fleet(setup.clients, setup.non_iid, setup.seed)
        _PROCESS_STATE[setup] = (open_trainer(package, setup.library, setup.seed), shards)
    return _PROCESS_STATE[setup]


def client_reply(setup: FleetSetup, msg: Message, context: Context) -> Message:
    """A client's answer to a training message: its update and its sample count."""
    client = int(context.node_config["partition-id"])
    config = msg.content["config"]
    server_round = int(config["server-round"])
    if (client, server_round) in setup.faults:
        if setup.kill_on_fault:
            os.kill(os.getpid(), signal.SIGKILL)
        raise ClientCrash(f"client {client} crashed in round {server_round}")
    trainer, shards = trainer_and_shards(setup)
    x, y = shards[client]
    seed = setup.client_seed(client, server_round)
    metrics = {"num-examples": len(x), "emulated": int(not setup.library)}
    if is_int8(trainer):
        update, loss = int8_local_round(trainer, as_numpy(msg.content["arrays"]), x, y,
                                        setup.local, seed)
        metrics["local-steps"] = setup.local.steps
    else:
        update, loss = local_round(trainer, as_numpy(msg.content["arrays"]), x, y, setup.local,
                                   seed, proximal_mu=float(config.get("proximal-mu", 0.0)))
    metrics = MetricRecord({**metrics, "train-loss": loss})
    return Message(RecordDict({"arrays": as_record(update), "metrics": metrics}), reply_to=msg)


def client_app(setup: FleetSetup) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return client_reply(setup, msg, context)

    return app


def metered(strategy_cls):
    """`strategy_cls` counting the bytes each round sends and receives, and keeping each
    round's replies (update, weight), so that a test can redo the aggregation."""

    class Metered(strategy_cls):
        replies: dict = {}

        def configure_train(self, server_round, arrays, config, grid):
            messages = list(super().configure_train(server_round, arrays, config, grid))
            self.bytes_down = sum(m.content["arrays"].count_bytes() for m in messages)
            self.sampled = len(messages)
            return messages

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            good = [m for m in replies if not m.has_error()]
            self.bytes_up = sum(m.content["arrays"].count_bytes() for m in good)
            self.failures = len(replies) - len(good)
            self.emulated = sum(int(m.content["metrics"]["emulated"]) for m in good)
            self.replies = {**self.replies, server_round: [
                (as_numpy(m.content["arrays"]), m.content["metrics"]["num-examples"])
                for m in good]}
            return super().aggregate_train(server_round, replies)

    Metered.__name__ = strategy_cls.__name__
    return Metered


@dataclass
class ServerPlan:
    strategy: str
    rounds: int
    fraction_fit: float
    initial: dict[str, np.ndarray]
    evaluate: object  # (round, tensors) -> dict of metrics, called after every round
    checkpoint_dir: Path
    strategy_args: dict = field(default_factory=dict)
    seed: int = 0
    on_round: object = None  # (metrics) -> None, after each round's evaluation
    precision: str = "fp32"  # "int8": int8 clients, merged by Int8FedAvg (strategy fedavg)
    result: dict = field(default_factory=dict)  # filled by the run: the strategy, the model


def save_checkpoint(directory: Path, server_round: int, tensors: dict[str, np.ndarray]):
    """The global model after a round, written whole or not at all (temp file, rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"round_{server_round:03d}.npz"
    temp = final.with_suffix(".tmp.npz")
    np.savez(temp, **tensors)
    os.replace(temp, final)


def run_server(plan: ServerPlan, clients: int, grid: Grid) -> None:
    """The server's rounds: sample, send, merge with the plan's strategy, evaluate and
    checkpoint the global model after each round. Fills plan.result."""
    random.seed(plan.seed)  # Flower samples the round's clients with `random`
    # Flower sizes a round's sample by the nodes connected at that moment: min_train_nodes
    # keeps the first round from starting with whichever clients came up first
    merge = Int8FedAvg if plan.precision == "int8" else STRATEGIES[plan.strategy]
    strategy = metered(merge)(
        fraction_train=plan.fraction_fit, fraction_evaluate=0.0,
        min_train_nodes=max(int(clients * plan.fraction_fit), 1),
        min_available_nodes=clients, **plan.strategy_args)
    plan.result["strategy"] = strategy
    started = [time.perf_counter()]

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        tensors = {**plan.initial, **as_numpy(arrays)}
        save_checkpoint(plan.checkpoint_dir, server_round, tensors)
        metrics = plan.evaluate(server_round, tensors)
        now = time.perf_counter()
        if server_round:
            metrics.update(seconds=now - started[0], bytes_up=strategy.bytes_up,
                           bytes_down=strategy.bytes_down, clients=strategy.sampled,
                           failures=strategy.failures, emulated=strategy.emulated)
        started[0] = now
        plan.result.setdefault("rounds", []).append(metrics)
        if server_round and plan.on_round:
            plan.on_round(metrics)
        return MetricRecord({k: float(v) for k, v in metrics.items()})

    final = strategy.start(grid=grid, initial_arrays=as_record(plan.initial),
                           num_rounds=plan.rounds, evaluate_fn=evaluate,
                           train_config=ConfigRecord())
    plan.result["model"] = {**plan.initial, **as_numpy(final.arrays)}


def server_app(plan: ServerPlan, clients: int) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(plan, clients, grid)

    return app
