"""The fleet's ServerApp: each round sample the clients, send the global model, screen the
replies (screening.py), merge them with one of Flower's strategies, evaluate and checkpoint.

A round fails, loudly, when fewer clients than `min_clients` (default: a majority of those
sampled) sent an update the screen let in: the global model stays as it was and the round
says why. What travels down is the global model in the dtypes it started with (float32):
a strategy that computes in float64 on the server (FedAdam) or adds noise (differential
privacy) does not double what the clients receive, and the bytes counted are those sent.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx

from ..errors import UbitrainError
from .int8_exchange import Int8FedAvg
from .records import as_numpy, as_record
from .screening import screened

STRATEGIES = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam}


def strategy_class(strategy):
    """A strategy's name ("fedavg", "fedprox", "fedadam") or a Flower strategy class derived
    from FedAvg (FedTrimmedAvg, FedMedian, your own...) -> the class."""
    if isinstance(strategy, str) and strategy in STRATEGIES:
        return STRATEGIES[strategy]
    if isinstance(strategy, type) and issubclass(strategy, FedAvg):
        return strategy
    raise UbitrainError(f"strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}, or pass "
                        "a Flower strategy class derived from flwr.serverapp.strategy.FedAvg")


def required_clients(min_clients: int | None, sampled: int) -> int:
    """The replies a round needs: `min_clients`, or a majority of the sampled clients."""
    return sampled // 2 + 1 if min_clients is None else min_clients


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
    min_clients: int | None = None  # replies a round needs; None: a majority of the sampled
    screen: str | None = "norm"  # which updates are refused (screening.py)
    dp: dict | None = None  # Flower's central DP with client-side clipping: its arguments
    stop: threading.Event | None = None  # set: the run stops at its next poll (Ctrl-C)
    result: dict = field(default_factory=dict)  # filled by the run: the strategy, the model

    def as_sent(self, tensors: dict) -> dict:
        """`tensors` in the initial model's dtypes (what the clients are sent)."""
        return {k: np.asarray(v, self.initial[k].dtype) if k in self.initial else v
                for k, v in tensors.items()}


def metered(strategy_cls, plan: ServerPlan):
    """`strategy_cls` sending the global model in its initial dtypes, counting the bytes each
    round sends and receives, refusing the replies the plan's screen refuses, failing a
    round with fewer good replies than the plan requires, and keeping each round's merged
    replies (update, weight), so that a test can redo the aggregation."""

    class Metered(strategy_cls):
        replies: dict = {}

        def configure_train(self, server_round, arrays, config, grid):
            arrays = as_record(plan.as_sent(as_numpy(arrays)))
            self.sent = as_numpy(arrays)
            messages = list(super().configure_train(server_round, arrays, config, grid))
            self.bytes_down = sum(m.content["arrays"].count_bytes() for m in messages)
            self.sampled = len(messages)
            # until aggregate_train runs (a wrapper such as Flower's DP may skip it)
            self.bytes_up, self.failures, self.emulated, self.refused = 0, 0, 0, []
            self.failed = "the strategy merged no reply (a wrapper skipped the round)"
            return messages

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            answered = [m for m in replies if not m.has_error()]
            self.bytes_up = sum(m.content["arrays"].count_bytes() for m in answered)
            reasons = screened([as_numpy(m.content["arrays"]) for m in answered], self.sent,
                               plan.screen)
            good = [m for m, r in zip(answered, reasons) if r is None]
            self.refused = [r for r in reasons if r is not None]
            self.failures = len(replies) - len(good)
            self.emulated = sum(int(m.content["metrics"]["emulated"]) for m in good)
            need = required_clients(plan.min_clients, self.sampled)
            self.failed = None
            if len(good) < need:
                self.failed = (f"{len(good)} of {self.sampled} clients sent an update it could "
                               f"merge, at least {need} needed (min_clients)"
                               + (f"; refused: {'; '.join(self.refused)}" if self.refused
                                  else ""))
                return None, None
            self.replies = {**self.replies, server_round: [
                (as_numpy(m.content["arrays"]), m.content["metrics"]["num-examples"])
                for m in good]}
            return super().aggregate_train(server_round, good)

    Metered.__name__ = strategy_cls.__name__
    return Metered


def save_checkpoint(directory: Path, server_round: int, tensors: dict[str, np.ndarray]):
    """The global model after a round, written whole or not at all (temp file, rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"round_{server_round:03d}.npz"
    temp = final.with_suffix(".tmp.npz")
    np.savez(temp, **tensors)
    os.replace(temp, final)


class RunStopped(UbitrainError):
    """The run was stopped (Ctrl-C) while the server waited for the clients."""


class StoppableGrid(Grid):
    """`grid` whose send_and_receive gives up as soon as `stop` is set: Flower's waits for a
    round's replies up to an hour, and the simulation's server thread would keep the
    process alive that long after Ctrl-C stopped the clients."""

    POLL = 0.1

    def __init__(self, grid: Grid, stop: threading.Event):
        self.grid, self.stop = grid, stop

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs):
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self):
        if self.stop.is_set():
            raise RunStopped("the run was stopped")
        return self.grid.get_node_ids()

    def push_messages(self, messages):
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        waiting = set(self.push_messages(messages))
        end = time.monotonic() + (timeout if timeout is not None else float("inf"))
        replies = []
        while waiting and time.monotonic() < end:
            if self.stop.is_set():
                raise RunStopped("the run was stopped")
            got = list(self.pull_messages(waiting))
            replies.extend(got)
            waiting -= {m.metadata.reply_to_message_id for m in got}
            if waiting:
                self.stop.wait(self.POLL)
        return replies


def build_strategy(plan: ServerPlan, clients: int):
    """(the strategy the rounds run, the metered one inside it)."""
    merge = Int8FedAvg if plan.precision == "int8" else strategy_class(plan.strategy)
    # Flower sizes a round's sample by the nodes connected at that moment: min_train_nodes
    # keeps the first round from starting with whichever clients came up first
    inner = metered(merge, plan)(
        fraction_train=plan.fraction_fit, fraction_evaluate=0.0,
        min_train_nodes=max(int(clients * plan.fraction_fit), 1),
        min_available_nodes=clients, **plan.strategy_args)
    if not plan.dp:
        return inner, inner
    from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping

    outer = DifferentialPrivacyClientSideFixedClipping(
        inner, num_sampled_clients=max(int(clients * plan.fraction_fit), 1), **plan.dp)
    return outer, inner


def run_server(plan: ServerPlan, clients: int, grid: Grid) -> None:
    """The server's rounds: sample, send, screen, merge with the plan's strategy, evaluate
    and checkpoint the global model after each round. Fills plan.result."""
    random.seed(plan.seed)  # Flower samples the round's clients with `random`
    if plan.stop is not None:
        grid = StoppableGrid(grid, plan.stop)
    strategy, metered_strategy = build_strategy(plan, clients)
    plan.result["strategy"] = metered_strategy
    started = [time.perf_counter()]

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        tensors = plan.as_sent({**plan.initial, **as_numpy(arrays)})
        save_checkpoint(plan.checkpoint_dir, server_round, tensors)
        metrics = plan.evaluate(server_round, tensors)
        now = time.perf_counter()
        if server_round:
            s = metered_strategy
            metrics.update(seconds=now - started[0], bytes_up=s.bytes_up,
                           bytes_down=s.bytes_down, clients=s.sampled, failures=s.failures,
                           emulated=s.emulated, refused=len(s.refused))
            if s.failed:
                metrics["failed"] = s.failed
        started[0] = now
        plan.result.setdefault("rounds", []).append(metrics)
        if server_round and plan.on_round:
            plan.on_round(metrics)
        return MetricRecord({k: float(v) for k, v in metrics.items()
                             if isinstance(v, (int, float))})

    final = strategy.start(grid=grid, initial_arrays=as_record(plan.initial),
                           num_rounds=plan.rounds, evaluate_fn=evaluate,
                           train_config=ConfigRecord())
    plan.result["model"] = plan.as_sent({**plan.initial, **as_numpy(final.arrays)})


def server_app(plan: ServerPlan, clients: int) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(plan, clients, grid)

    return app


def failed_rounds(rounds: list[dict]) -> list[dict]:
    return [m for m in rounds[1:] if m.get("failed")]


def check_outcome(rounds: list[dict], log) -> None:
    """Every round failed: an error (the run trained nothing). Some did: said once more."""
    failed = failed_rounds(rounds)
    if failed and len(failed) == len(rounds) - 1:
        raise UbitrainError(f"every round failed: round 1: {failed[0]['failed']}; no client "
                            "update was merged (see the clients' errors with --verbose)")
    if failed:
        log(f"warning: {len(failed)} of {len(rounds) - 1} rounds failed "
            f"(rounds {', '.join(str(m['round']) for m in failed)}); the global model skipped "
            "them")
