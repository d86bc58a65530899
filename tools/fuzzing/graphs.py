"""Random models: DAGs of the ops in the op table (ops/), with branches, fan-out and merges.

A `Graph` is an input shape and a list of nodes, each an op over earlier nodes (index 0 is
the input) with its attributes. Shapes are inferred, never stored: a reduction (reduce.py)
may drop a node or shrink the input and learn at once whether the graph is still valid.
Every node that nothing else reads feeds the head, so no branch is dead: the head flattens
them, concatenates them and maps them to the output with a Linear layer.

`source(graph)` is the model as Python (a `Net` class), the same text a repro script
holds; `instantiate(graph)` runs it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import torch

from .ops import OPS

MAX_ELEMENTS = 1536  # per sample, per tensor: small models compile in about a second
# how often each op is drawn, against 1 for the others (the layers are what a model is made of)
WEIGHTS = {"conv2d": 4, "conv1d": 2, "linear": 2, "batch_norm": 3, "max_pool2d": 2,
           "avg_pool2d": 2, "binary": 2, "cat": 2}


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[int, ...]
    attrs: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Graph:
    input_shape: tuple[int, ...]  # the batch first
    nodes: tuple[Node, ...]  # node i + 1 is value i + 1; value 0 is the input
    outputs: int  # classes (cross-entropy) or features (MSE) of the head
    loss: str = "cross_entropy"

    def shapes(self) -> list[tuple] | None:
        """Every value's shape, or None when an op does not fit its inputs."""
        shapes = [tuple(self.input_shape)]
        for node in self.nodes:
            ins = [shapes[i] for i in node.inputs if i < len(shapes)]
            if len(ins) != len(node.inputs):
                return None
            try:
                out = OPS[node.op].infer(ins, node.attrs)
            except (IndexError, KeyError, ValueError, ZeroDivisionError):
                out = None
            if out is None or math.prod(out[1:]) > MAX_ELEMENTS or 0 in out:
                return None
            shapes.append(tuple(out))
        return shapes

    def leaves(self) -> list[int]:
        """Values no node reads (the last node included): the head's inputs."""
        read = {i for n in self.nodes for i in n.inputs}
        return [i for i in range(1, len(self.nodes) + 1) if i not in read] or [0]


def source(graph: Graph) -> str:
    """The model as the Python source of `class Net(nn.Module)`."""
    shapes = graph.shapes()
    if shapes is None:
        raise ValueError("the graph is not valid")
    init, body = [], []
    for i, node in enumerate(graph.nodes, 1):
        op = OPS[node.op]
        name = f"{node.op}{i}"
        layer = op.layer and op.layer([shapes[j] for j in node.inputs], node.attrs)
        if layer is not None:  # a module, or a constant tensor (an attention mask)
            init.append(f"self.{name} = {layer}")
        args = [_value(j) for j in node.inputs]
        body.append(f"{_value(i)} = {op.call(args, node.attrs, name)}")
    leaves = graph.leaves()
    features = sum(math.prod(shapes[i][1:]) for i in leaves)
    flat = [f"{_value(i)}.reshape({_value(i)}.shape[0], -1)" for i in leaves]
    head = flat[0] if len(flat) == 1 else f"torch.cat([{', '.join(flat)}], 1)"
    init.append(f"self.head = nn.Linear({features}, {graph.outputs})")
    body.append(f"return self.head({head})")
    lines = ["class Net(nn.Module):", "    def __init__(self):", "        super().__init__()"]
    lines += [f"        {line}" for line in init]
    lines += ["", "    def forward(self, x):"] + [f"        {line}" for line in body]
    return "\n".join(lines) + "\n"


def _value(i: int) -> str:
    return "x" if i == 0 else f"t{i}"


# The names a model's source uses (repro scripts import them too): torchvision's plain-Python
# layers (StochasticDepth) come without its C extension (real_models.torchvision_ops).
PRELUDE = """import torch
import torch.nn.functional as F  # noqa: F401 (the model may use it)
from torch import nn

from tools.real_models import torchvision_ops  # noqa: F401 (the model may use it)
"""


def instantiate(graph: Graph, seed: int) -> torch.nn.Module:
    """The model, its weights drawn from `seed`; BatchNorm and LayerNorm affine parameters
    moved off their ones and zeros, so that their gradients are not symmetric."""
    namespace: dict = {}
    exec(PRELUDE + source(graph), namespace)
    torch.manual_seed(seed)
    model = namespace["Net"]()
    vary_norm_parameters(model, seed)
    return model


def vary_norm_parameters(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.uniform_(0.5, 1.5, generator=gen)
                    m.bias.normal_(0.0, 0.2, generator=gen)


def random_graph(rng: random.Random, ops=None, accepts=None, input_shape=None) -> Graph:
    """A random valid graph of 2 to 14 nodes. A restricted draw (the int8 fuzzer's) gives
    `ops`, the op names to draw from, `accepts(name, attrs, input shapes, input ops)`,
    whether a drawn node is in its reach, and `input_shape(rng)`."""
    while True:
        graph = _attempt(rng, ops, accepts, input_shape)
        if graph is not None and graph.shapes() is not None:
            return graph


def _input_shape(rng: random.Random) -> tuple[int, ...]:
    batch = rng.choice([1, 2, 2, 3, 4, 4, 5, 8, 16])
    rank = rng.choice([4, 4, 4, 3, 2])
    channels = rng.randint(1, 6)
    if rank == 4:
        return (batch, channels, rng.randint(1, 9), rng.randint(1, 9))
    if rank == 3:
        return (batch, channels, rng.randint(1, 12))
    return (batch, rng.randint(1, 24))


def _attempt(rng: random.Random, ops, accepts, input_shape) -> Graph | None:
    shape, outputs = (input_shape or _input_shape)(rng), rng.randint(1, 10)
    loss = rng.choice(["cross_entropy", "cross_entropy", "mse"])
    if loss == "cross_entropy":  # over one class the loss is 0 whatever the weights: no
        outputs = max(outputs, 2)  # gradient, no backward checked (no draw: other seeds stay)
    graph = Graph(shape, (), outputs, loss)
    shapes = graph.shapes()
    if shapes is None:
        return None
    names = sorted(ops or OPS)
    weights = [WEIGHTS.get(n, 1) for n in names]
    for _ in range(rng.randint(2, 14)):
        for _try in range(30):
            first = len(shapes) - 1 if rng.random() < 0.7 else rng.randrange(len(shapes))
            name = rng.choices(names, weights)[0]
            op = OPS[name]
            inputs = [first]
            if op.arity == 2:
                partner = _partner(rng, shapes, first, name)
                if partner is None:
                    continue
                inputs.append(partner)
            attrs = op.sample(rng, [shapes[i] for i in inputs])
            if attrs is None or accepts and not accepts(
                    name, attrs, [shapes[i] for i in inputs],
                    [graph.nodes[i - 1].op if i else "input" for i in inputs]):
                continue
            candidate = replace(graph, nodes=graph.nodes + (Node(name, tuple(inputs), attrs),))
            new_shapes = candidate.shapes()
            if new_shapes is not None:
                graph, shapes = candidate, new_shapes
                break
    return graph if graph.nodes else None


def _partner(rng, shapes, first, name) -> int | None:
    """A second operand: a value of the same shape, or (binary ops) one that broadcasts."""
    target = shapes[first]
    same = [i for i, s in enumerate(shapes) if i != first and s == target]
    if name == "cat":
        same = [i for i, s in enumerate(shapes) if len(s) == len(target) and s[0] == target[0]
                and sum(a != b for a, b in zip(s, target)) <= 1]
    else:
        same += [i for i, s in enumerate(shapes) if len(s) == len(target) and s != target
                 and s[0] == target[0]
                 and all(a == b or 1 in (a, b) for a, b in zip(s, target))]
    return rng.choice(same) if same else (first if rng.random() < 0.3 else None)
