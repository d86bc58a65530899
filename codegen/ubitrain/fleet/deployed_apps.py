"""The fleet's apps for Flower's deployment engine (a SuperLink, SuperNodes and `flwr run`):
the same client and server as in the simulation, configured by the run config (what every
process shares: the compiled projects, the data directory, the rounds) and by each
SuperNode's node config (its client number, and optionally its own project and library: a
device's build of the same model, such as a Cortex-M board under QEMU, and its own data
file).

The Flower App that names these (pyproject.toml) is written by deployment.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .apps import FleetSetup, client_reply, clipping_mod
from .local import LocalTraining
from .server import ServerPlan, run_server


def setup_from(config) -> FleetSetup:
    kills = frozenset(tuple(int(n) for n in pair.split(":"))  # "client:round,..."
                      for pair in str(config.get("kill", "")).split(",") if pair)
    return FleetSetup(Path(config["project"]), Path(config["library"]) if config["library"]
                      else None, Path(config["data-dir"]), int(config["seed"]),
                      LocalTraining(int(config["local-steps"]), int(config["batch"]),
                                    float(config["lr"])),
                      faults=kills, kill_on_fault=True)


client = ClientApp(mods=[clipping_mod])


@client.train()
def train(msg: Message, context: Context) -> Message:
    # a SuperNode's own project and library (a device build), and its own data file,
    # replace the run's
    node = {**context.run_config, **context.node_config}
    return client_reply(setup_from(node), msg, context, shard=node.get("data") or None)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from ..api import load_package
    from .data import load_shard
    from .evaluation import model_metrics
    from .int8_exchange import exchanged_int8_names, initial_int8_model, without_step
    from .local import exchanged_names
    from .packages import open_trainer
    from .simulate import round_line

    config = context.run_config
    seed, sparse = int(config["seed"]), bool(config["sparse"])
    evaluator = open_trainer(load_package(config["server-project"]),
                             Path(config["server-library"]), seed)
    int8 = config["precision"] == "int8"
    test_file = Path(config["data-dir"]) / "test.npz"
    test = load_shard(test_file) if test_file.exists() else None
    if int8:  # int8 weights, their exponents and the fleet's NITI step count
        initial = initial_int8_model(evaluator, exchanged_int8_names(evaluator, sparse))
    else:
        names = exchanged_names(evaluator, sparse)
        initial = {k: v for k, v in evaluator.parameters().items() if k in names}
    out_dir = Path(config["out-dir"])

    def evaluate(server_round, tensors):
        tensors = without_step(tensors) if int8 else tensors
        return {"round": server_round, **model_metrics(evaluator, test, tensors)}

    def report(m):
        print(round_line(m, int(config["rounds"]), "an emulated board"), flush=True)

    min_clients = int(config["min-clients"])
    plan = ServerPlan(str(config["strategy"]), int(config["rounds"]),
                      float(config["fraction-fit"]), initial, evaluate, out_dir / "checkpoints",
                      strategy_args=json.loads(config["strategy-args"]), seed=seed,
                      on_round=report, precision=config["precision"],
                      min_clients=min_clients if min_clients > 0 else None,
                      screen=json.loads(config["screen"]), dp=json.loads(config["dp"]))
    run_server(plan, int(config["clients"]), grid)
    (out_dir / "rounds.json").write_text(json.dumps(plan.result["rounds"], indent=1))
