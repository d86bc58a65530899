"""Flower's apps around ubitrain trainers: a ClientApp whose training is the generated C
step, and a ServerApp that merges the clients' updates with one of Flower's strategies.

The same two apps run under Flower's simulation engine (simulate.py) and its deployment
engine (a SuperLink and SuperNodes). A simulation worker keeps one trainer and the shards
for all the rounds and virtual clients it serves: a client's state is the global model,
loaded at the start of each round, so nothing of it lives in the trainer between rounds.
An int8 package's clients exchange int8 weights, merged exactly by Int8FedAvg
(int8_exchange.py). A client reads its model from the compiled project's directory
(packages.py) and its data from its own shard file (data.py).
"""

from __future__ import annotations

import os
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

from ..errors import UbitrainError
from ..project.manifest import load_package
from .data import load_shard, shard_file
from .int8_exchange import Int8FedAvg, int8_local_round, is_int8
from .local import LocalTraining, local_round
from .packages import open_trainer
from .records import as_numpy, as_record

STRATEGIES = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam}


@dataclass(frozen=True)
class FleetSetup:
    """What a client needs to rebuild its part, small and picklable: where its compiled
    project is (package.json and the C) and its built library, where the shards are, the
    local training."""

    project: Path  # the clients' compiled project (project/manifest.py)
    library: Path | None  # its host build; None: the project's target under its emulator
    data_dir: Path  # client_NNNNN.npz, one shard a client (data.py)
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


_TRAINERS: dict = {}  # per process: one trainer a (project, library, seed), built once
_SHARDS: dict = {}  # per process: the shards it has read, by file


def client_trainer(setup: FleetSetup):
    """This process's trainer of the setup's project, made once."""
    key = (setup.project, setup.library, setup.seed)
    if key not in _TRAINERS:
        _TRAINERS[key] = open_trainer(load_package(setup.project), setup.library, setup.seed)
    return _TRAINERS[key]


def client_shard(path: Path):
    if path not in _SHARDS:
        _SHARDS[path] = load_shard(path)
    return _SHARDS[path]


def client_reply(setup: FleetSetup, msg: Message, context: Context,
                 shard: Path | None = None) -> Message:
    """A client's answer to a training message: its update and its sample count. `shard`:
    its data file (default: its partition's file in the setup's data directory)."""
    client = int(context.node_config["partition-id"])
    config = msg.content["config"]
    server_round = int(config["server-round"])
    if (client, server_round) in setup.faults:
        if setup.kill_on_fault:
            os.kill(os.getpid(), signal.SIGKILL)
        raise ClientCrash(f"client {client} crashed in round {server_round}")
    trainer = client_trainer(setup)
    x, y = client_shard(Path(shard) if shard else shard_file(setup.data_dir, client))
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


def strategy_class(strategy):
    """A strategy's name ("fedavg", "fedprox", "fedadam") or a Flower strategy class derived
    from FedAvg (FedTrimmedAvg, FedMedian, your own...) -> the class."""
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return STRATEGIES[strategy]
    if isinstance(strategy, type) and issubclass(strategy, FedAvg):
        return strategy
    raise UbitrainError(f"strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}, or pass "
                        "a Flower strategy class derived from flwr.serverapp.strategy.FedAvg")


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
    strategy: object  # a name of STRATEGIES or a FedAvg subclass (strategy_class)
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
    merge = Int8FedAvg if plan.precision == "int8" else strategy_class(plan.strategy)
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
