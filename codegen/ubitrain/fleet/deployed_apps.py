"""The fleet's apps for Flower's deployment engine (a SuperLink, SuperNodes and `flwr run`):
the same client and server as in the simulation, configured by the run config (what every
process shares: the compiled package, the split, the rounds) and by each SuperNode's node
config (its client number, and optionally its own package: a device's build of the same
model, such as a Cortex-M board under QEMU).

The Flower App that names these (pyproject.toml) is written by deployment.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .apps import FleetSetup, ServerPlan, client_reply, run_server
from .data import digits_fleet
from .local import LocalTraining


def setup_from(config) -> FleetSetup:
    alpha = float(config["non-iid"])
    kills = frozenset(tuple(int(n) for n in pair.split(":"))  # "client:round,..."
                      for pair in str(config.get("kill", "")).split(",") if pair)
    return FleetSetup(Path(config["package"]), Path(config["library"]) if config["library"]
                      else None, int(config["clients"]), alpha if alpha > 0 else None,
                      int(config["seed"]), LocalTraining(int(config["local-steps"]),
                                                         int(config["batch"]),
                                                         float(config["lr"])),
                      faults=kills, kill_on_fault=True)


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    # a SuperNode's own package and library (a device build) replace the run's
    return client_reply(setup_from({**context.run_config, **context.node_config}), msg, context)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from .apps import open_trainer
    from .int8_exchange import exchanged_int8_names, initial_int8_model, without_step
    from .local import exchanged_names
    from .simulate import test_metrics

    config = context.run_config
    setup = setup_from(config)
    package = pickle.loads(setup.package_file.read_bytes())
    evaluator = open_trainer(package, setup.library, setup.seed)
    int8 = config.get("precision", "fp32") == "int8"
    _, (x_test, y_test) = digits_fleet(setup.clients, setup.non_iid, setup.seed)
    if int8:  # int8 weights, their exponents and the fleet's NITI step count
        initial = initial_int8_model(evaluator, exchanged_int8_names(evaluator, sparse=False))
    else:
        names = exchanged_names(evaluator, sparse=False)
        initial = {k: v for k, v in evaluator.parameters().items() if k in names}
    out_dir = Path(config["out-dir"])

    def evaluate(server_round, tensors):
        tensors = without_step(tensors) if int8 else tensors
        return {"round": server_round, **test_metrics(evaluator, x_test, y_test, tensors)}

    def report(metrics):
        print(f"round {metrics['round']}/{config['rounds']}: test accuracy "
              f"{100 * metrics['accuracy']:.1f}%, {metrics['clients'] - metrics['failures']}/"
              f"{metrics['clients']} clients ({metrics['emulated']} emulated), "
              f"{metrics['seconds']:.1f} s", flush=True)

    plan = ServerPlan(str(config["strategy"]), int(config["rounds"]),
                      float(config["fraction-fit"]), initial, evaluate, out_dir / "checkpoints",
                      strategy_args={"rounding": "nearest", "seed": setup.seed} if int8 else {},
                      seed=setup.seed, on_round=report, precision="int8" if int8 else "fp32")
    run_server(plan, setup.clients, grid)
    (out_dir / "rounds.json").write_text(json.dumps(plan.result["rounds"], indent=1))
