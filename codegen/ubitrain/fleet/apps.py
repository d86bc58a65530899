"""The fleet's ClientApp: its training is the generated C step (the ServerApp that merges
the updates is server.py).

The same apps run under Flower's simulation engine (simulate.py) and its deployment
engine (a SuperLink and SuperNodes). A simulation worker keeps one trainer and the shards
for all the rounds and virtual clients it serves: a client's state is the global model,
loaded at the start of each round, so nothing of it lives in the trainer between rounds.
An int8 package's clients exchange int8 weights, merged exactly by Int8FedAvg
(int8_exchange.py). A client reads its model from the compiled project's directory
(packages.py) and its data from its own shard file (data.py).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..api import load_package
from .data import load_shard, shard_file
from .int8_exchange import int8_local_round, is_int8
from .local import LocalTraining, local_round
from .packages import open_trainer
from .records import as_numpy, as_record

FAULTS = ("crash", "nan", "inf", "huge")  # what a faulty client does (tests, measurements)


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
    # (client, round) pairs where a client crashes, or {(client, round): one of FAULTS}
    faults: frozenset | dict = field(default_factory=frozenset)
    kill_on_fault: bool = False  # a crash kills the client's process (SIGKILL)

    def fault(self, client: int, server_round: int) -> str | None:
        if isinstance(self.faults, dict):
            return self.faults.get((client, server_round))
        return "crash" if (client, server_round) in self.faults else None

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
    fault = setup.fault(client, server_round)
    if fault == "crash":
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
    if fault:
        update = poisoned(update, as_numpy(msg.content["arrays"]), fault)
    metrics = MetricRecord({**metrics, "train-loss": loss})
    return Message(RecordDict({"arrays": as_record(update), "metrics": metrics}), reply_to=msg)


def poisoned(update: dict, sent: dict, fault: str) -> dict:
    """A faulty client's update: NaN or inf in every float tensor, or a float update 10^4
    times as large as the one it trained."""
    out = {}
    for k, v in update.items():
        if np.asarray(v).dtype.kind != "f":
            out[k] = v
        elif fault == "huge":
            out[k] = (sent[k] + np.float32(1e4) * (v - sent[k])).astype(v.dtype)
        else:
            out[k] = np.full_like(v, np.nan if fault == "nan" else np.inf)
    return out


def clipping_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's fixedclipping_mod (central differential privacy, the update clipped on the
    client) when the server asks for it (its strategy sends a clipping norm), else nothing."""
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

    config = msg.content.config_records
    if any(KEY_CLIPPING_NORM in c for c in config.values()):
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def client_app(setup: FleetSetup) -> ClientApp:
    app = ClientApp(mods=[clipping_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return client_reply(setup, msg, context)

    return app
