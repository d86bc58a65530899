"""What the fleet's server should do with a poisoned update, measured: the digits CNN over 20
clients, 8 rounds of 10 local steps (`ubitrain fleet`'s defaults), clean and with client 3
sending a NaN, an inf or a 10^4-times update every round, for each candidate merge:

    fedavg        FedAvg, nothing refused (what the fleet did before issue 42)
    norm          FedAvg after refusing non-finite updates and those whose norm is over 10x
                  the median of the others' (screening.py; the fleet's default)
    clip          FedAvg after refusing non-finite updates and scaling every update down to
                  at most 10x the median of the others' norms
    trimmed       Flower's FedTrimmedAvg (beta 0.2) after refusing non-finite updates
    median        Flower's FedMedian after refusing non-finite updates

and, for the norm screen's factor, the largest ratio of a clean client's update norm to the
median of the others', IID and with Dirichlet(alpha) labels.

    python benchmarks/fleet_robust.py [--out results/fleet_robust.json]

The rounds run in this process (ubitrain.fleet.inline: Flower's strategies, the fleet's
ClientApp and server, no Ray); the clients train in the generated C.
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
from _results import write_json
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg

import ubitrain as ub
from ubitrain.demo import load_data
from ubitrain.fleet import split_dataset
from ubitrain.fleet.apps import FleetSetup, client_app
from ubitrain.fleet.evaluation import model_metrics
from ubitrain.fleet.inline import InlineGrid
from ubitrain.fleet.prepare import prepare
from ubitrain.fleet.records import as_numpy
from ubitrain.fleet.screening import NORM_FACTOR, _delta_norm, norm_ratios
from ubitrain.fleet.server import ServerPlan, run_server
from ubitrain.zoo import DigitsCNN

CLIENTS, ROUNDS, POISONED = 20, 8, 3


class ClippedFedAvg(FedAvg):
    """FedAvg of the updates, each scaled down to at most NORM_FACTOR x the median of the
    others' norms."""

    def configure_train(self, server_round, arrays, config, grid):
        self.sent = as_numpy(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        updates = [as_numpy(m.content["arrays"]) for m in replies]
        norms = [_delta_norm(u, self.sent) for u in updates]
        for i, (m, u) in enumerate(zip(replies, updates)):
            others = norms[:i] + norms[i + 1:]
            bound = NORM_FACTOR * float(np.median(others)) if others else norms[i]
            if norms[i] > bound:
                scale = bound / norms[i]
                m.content["arrays"] = ArrayRecord({
                    k: Array((self.sent[k] + scale * (v - self.sent[k])).astype(v.dtype))
                    for k, v in u.items()})
        return super().aggregate_train(server_round, replies)


MERGES = {"fedavg": ("fedavg", None), "norm": ("fedavg", "norm"),
          "clip": (ClippedFedAvg, "finite"), "trimmed": (FedTrimmedAvg, "finite"),
          "median": (FedMedian, "finite")}


def prepared(where: Path, alpha=None):
    x_train, y_train, x_test, y_test = load_data(0)
    shards = split_dataset(x_train, y_train, CLIENTS, alpha, 0)
    return prepare(DigitsCNN, shards, (x_test, y_test), out_dir=where, target="host",
                   precision="fp32", optimizer=ub.SGD(lr=0.05, momentum=0.9), batch=16,
                   local_steps=10, sparse=False, seed=0, progress=False,
                   total_steps=CLIENTS * 10 * ROUNDS)


def run(prep, where: Path, merge: str, fault: str | None) -> dict:
    strategy, screen = MERGES[merge]
    faults = {(POISONED, r): fault for r in range(1, ROUNDS + 1)} if fault else {}
    setup = FleetSetup(prep.client_project, prep.client_library, prep.data_dir, 0, prep.local,
                       faults)
    plan = ServerPlan(strategy, ROUNDS, 1.0, prep.initial,
                      lambda r, t: {"round": r, **model_metrics(prep.evaluator, prep.test, t)},
                      where / "checkpoints", screen=screen, min_clients=1,
                      strategy_args={"beta": 0.2} if strategy is FedTrimmedAvg else {})
    run_server(plan, CLIENTS, InlineGrid(client_app(setup), CLIENTS))
    return plan.result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/fleet_robust.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in (None, 0.5, 0.1):
            prep = prepared(Path(tmp) / f"split{alpha}", alpha)
            result = run(prep, Path(tmp) / "ratios", "fedavg", None)
            ratios = [max(norm_ratios([u for u, _ in replies], sent))
                      for replies, sent in zip(result["strategy"].replies.values(),
                                               _sent_models(Path(tmp) / "ratios"))]
            rows.append(dict(measure="norm ratio", alpha=alpha, max_ratio=max(ratios)))
            print(f"clean clients, alpha {alpha}: largest update norm / median of the others "
                  f"{max(ratios):.2f} (per round {', '.join(f'{r:.2f}' for r in ratios)})",
                  flush=True)
        prep = prepared(Path(tmp) / "iid")
        for merge in MERGES:
            for fault in (None, "nan", "inf", "huge"):
                result = run(prep, Path(tmp) / f"{merge}{fault}", merge, fault)
                accuracy = result["rounds"][-1]["accuracy"]
                refused = sum(m.get("refused", 0) for m in result["rounds"][1:])
                rows.append(dict(measure="accuracy", merge=merge, fault=fault,
                                 accuracy=accuracy, refused=refused))
                print(f"{merge:8} {str(fault):5} accuracy {100 * accuracy:5.1f}%  refused "
                      f"{refused}", flush=True)
    write_json(args.out, rows)


def _sent_models(checkpoints: Path):
    """The global model each round started from (round r's replies trained from r - 1's)."""
    return [dict(np.load(checkpoints / "checkpoints" / f"round_{r:03d}.npz"))
            for r in range(ROUNDS)]


if __name__ == "__main__":
    main()
