"""One int8 case of the differential fuzzer: a random model in the int8 op set, compiled with
precision="int8" and checked bit for bit against NITI's numpy reference
(ubitrain.fidelity.niti_check).

The draw is the float fuzzer's (graphs.py) restricted to what NITI has an integer form
for: convs (plain, strided, padded, grouped, depthwise; not dilated), Linear on features,
ReLU, BatchNorm, max and average pooling over windows that tile the map, the global
average, residual adds of equal shapes, concat on any axis, and flatten; 4-D inputs and
cross-entropy (the head concatenates the leaves). NITI's mu, the rescaling (counted or
adaptive, intervals up to 4) and 1 to 3 steps are drawn too.

The BatchNorm mode is drawn first, from a stream of its own (so a "fold" case draws the
graph it drew before the mode existed): "fold" takes a BatchNorm only after a conv (folded
into it), "integer" after any node (NITI's integer BatchNorm with batch statistics). The weights'
exponents (one per tensor or per output channel) are drawn from a stream of their own too,
and so is whether each ReLU becomes one of the functions the step computes by table
(niti/tables.py: GELU in both forms, SiLU, Sigmoid, Tanh, Hardswish, Hardsigmoid).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

import ubitrain as ub
from ubitrain.fidelity.niti_check import compare_with_reference
from ubitrain.int8.update import BATCH_NORMS, NITI, WEIGHT_EXPONENTS

from .case import Outcome, run_guarded, seeded_batches
from .graphs import Graph, instantiate, random_graph

INT8_OPS = ("conv2d", "linear", "relu", "batch_norm", "max_pool2d", "avg_pool2d",
            "global_avg_pool", "binary", "cat", "flatten")
TABLE_FUNCTIONS = ("gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid")


def accepts(name: str, a: dict, shapes: list[tuple], producers: list[str],
            batch_norm: str = "fold") -> bool:
    """Whether a node the float draw made is in the int8 op set's reach."""
    if name == "batch_norm":  # folded into the conv before it, or an integer BatchNorm
        return batch_norm == "integer" or producers[0] == "conv2d"
    if name == "conv2d":
        return a["d"] == 1 and a["pad"] != "same"
    if name == "linear":
        return len(shapes[0]) == 2
    if name in ("max_pool2d", "avg_pool2d"):  # windows that tile the map
        return (a["s"] or a["k"]) == a["k"] and a["p"] == 0 and not a["ceil"] \
            and a.get("d", 1) == 1
    if name == "binary":
        return a["form"] == "add" and shapes[0] == shapes[1]
    return True


def _input_shape(rng: random.Random) -> tuple[int, ...]:
    return (rng.choice([1, 2, 4, 8]), rng.randint(1, 4), rng.randint(4, 12), rng.randint(4, 12))


@dataclass
class Int8Case:
    seed: int
    graph: Graph
    config: NITI
    steps: int


def with_tables(graph: Graph, seed: int) -> Graph:
    """Each ReLU of `graph` one of TABLE_FUNCTIONS, with probability 1/2."""
    rng = random.Random(f"{seed}:table_functions")
    return replace(graph, nodes=tuple(
        replace(n, op=rng.choice(TABLE_FUNCTIONS)) if n.op == "relu" and rng.random() < 0.5
        else n for n in graph.nodes))


def draw_int8_case(seed: int, batch_norm: str | None = None,
                   weight_exponents: str | None = None, tables: bool | None = None) -> Int8Case:
    """The case of `seed`; `batch_norm`, `weight_exponents` and `tables` override the drawn
    modes (a seed found before a mode was drawn keeps its case with "fold", "tensor" and
    no tables)."""
    batch_norm = batch_norm or random.Random(f"{seed}:batch_norm").choice(BATCH_NORMS)
    weight_exponents = weight_exponents or random.Random(f"{seed}:weight_exponents").choice(
        WEIGHT_EXPONENTS)
    if tables is None:
        tables = random.Random(f"{seed}:tables").random() < 0.5
    rng = random.Random(seed)
    graph = random_graph(rng, INT8_OPS, partial(accepts, batch_norm=batch_norm), _input_shape)
    graph = replace(graph, loss="cross_entropy", outputs=max(graph.outputs, 2))
    if tables:
        graph = with_tables(graph, seed)
    config = NITI(mu=(rng.randint(3, 6),), milestones=(), adaptive_rescale=rng.random() < 0.5,
                  max_interval=rng.choice([1, 2, 4]), batch_norm=batch_norm,
                  weight_exponents=weight_exponents)
    return Int8Case(seed, graph, config, rng.randint(1, 3))


def run_int8_case(case: Int8Case, workdir: Path | None = None) -> Outcome:
    return run_guarded(case.seed, lambda tmp: _run(case, tmp), workdir,
                       f"fuzz8_{case.seed}_")


def _run(case: Int8Case, tmp: Path) -> Outcome:
    g = case.graph
    model = instantiate(g, case.seed)
    batches = [(x.numpy(), y.numpy()) for x, y in seeded_batches(
        case.seed, 0, g.input_shape, case.steps, g.loss, g.outputs)]
    pkg = ub.compile(model, (torch.from_numpy(batches[0][0]),),
                     torch.from_numpy(batches[0][1].astype(np.int64)), precision="int8",
                     optimizer=case.config, out_dir=tmp / "m", progress=False)
    trainer = pkg.build()
    try:
        run = compare_with_reference(trainer, model, batches, case.config)
    finally:
        getattr(trainer, "close", lambda: None)()  # an emulated trainer's process
    if run.differences:
        return Outcome(case.seed, "mismatch", "; ".join(run.differences))
    return Outcome(case.seed, "match", f"{run.moved} parameter elements moved, "
                                       f"{run.skipped} reductions skipped")
