"""The fuzzer's op table (tools/fuzzing/ops) against PyTorch, without compiling: the
models it draws run forward and backward in PyTorch, in training mode (random masks, in-place
Dropout) and in eval mode, and every value has the shape the table's rules infer for it."""

import sys

import torch

from tools.fuzzing.case import draw_case
from tools.fuzzing.graphs import instantiate
from tools.fuzzing.ops import OPS

SEEDS = range(300)  # enough that every op of the table is drawn (checked below)


def _shapes_seen(model, graph, x):
    """The output, and each node's output shape: forward's locals `t<i>` (graphs.source names
    node i's value so) as it returns."""
    seen, forward = {}, type(model).forward.__code__

    def trace(frame, event, arg):
        if frame.f_code is not forward:
            return None  # only forward's own frame is followed
        if event == "return":
            seen.update({int(k[1:]): tuple(v.shape) for k, v in frame.f_locals.items()
                         if k[0] == "t" and k[1:].isdigit()})
        return trace

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        out = model(x)
    finally:
        sys.settrace(old)
    return out, seen


def test_drawn_models_run_in_pytorch_with_the_inferred_shapes():
    drawn = set()
    for seed in SEEDS:
        case = draw_case(seed)
        graph = case.graph
        expected = graph.shapes()
        model = instantiate(graph, seed).train()
        x = torch.randn(graph.input_shape, generator=torch.Generator().manual_seed(seed))
        out, seen = _shapes_seen(model, graph, x)
        for i, node in enumerate(graph.nodes, 1):
            assert seen[i] == expected[i], (seed, i, node.op, node.attrs)
        out.square().mean().backward()  # in place on a value autograd saved would raise here
        with torch.no_grad():
            assert model.eval()(x).shape == (graph.input_shape[0], graph.outputs)
        drawn.update(node.op for node in graph.nodes)
    assert drawn == set(OPS), f"never drawn in {SEEDS}: {sorted(set(OPS) - drawn)}"
