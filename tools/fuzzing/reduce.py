"""Shrink a failing fuzz case to a small one that fails the same way, and write it out as a
standalone repro script.

Greedy reduction: try one simplification at a time (fewer steps, fewer passes switched
off, plain SGD, a node dropped and its readers wired to one of its inputs of the same
shape, a smaller batch, input or layer, fewer outputs) and keep it when the case still
ends with the same status; stop when no simplification is kept or the budget is spent.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ubitrain.optim import SGD

from .case import Case, draw_case, run_case
from .graphs import PRELUDE, Graph, Node, source

BUDGET = 80  # cases run at most while reducing one failure (about 3 s each)


def reduce_case(case: Case, status: str, budget: int = BUDGET) -> Case:
    tried = 0
    improved = True
    while improved and tried < budget:
        improved = False
        for candidate in _simplifications(case):
            if tried >= budget:
                break
            tried += 1
            if run_case(candidate).status == status:
                case, improved = candidate, True
                break
    return case


def _simplifications(case: Case):
    if case.steps > 1:
        yield replace(case, steps=1)
    for p in case.disabled:
        yield replace(case, disabled=tuple(q for q in case.disabled if q != p))
    if case.optimizer != SGD(lr=0.1, momentum=0.9):
        yield replace(case, optimizer=SGD(lr=0.1, momentum=0.9))
    g = case.graph
    for i in range(len(g.nodes), 0, -1):
        for graph in _without_node(g, i):
            yield replace(case, graph=graph)
    for graph in _smaller(g):
        if graph.shapes() is not None:
            yield replace(case, graph=graph)


def _smaller(g: Graph):
    """The graph with a smaller batch or input dim, layer width or output."""
    shape = g.input_shape
    for d, n in enumerate(shape):
        for smaller in sorted({1, n // 2, n - 1} - {0, n}):
            yield replace(g, input_shape=shape[:d] + (smaller,) + shape[d + 1:])
    for i, node in enumerate(g.nodes):
        out = node.attrs.get("out")
        if isinstance(out, int) and out > 1:
            for smaller in sorted({1, out // 2} - {0, out}):
                nodes = list(g.nodes)
                nodes[i] = Node(node.op, node.inputs, {**node.attrs, "out": smaller})
                yield replace(g, nodes=tuple(nodes))
    if g.outputs > 2:
        yield replace(g, outputs=2)


def _without_node(g: Graph, i: int):
    """Graphs without value i: its readers read one of its inputs of the same shape instead
    (or, with no reader, it is simply dropped)."""
    shapes = g.shapes()
    node = g.nodes[i - 1]
    readers = any(i in n.inputs for n in g.nodes)
    options = [j for j in dict.fromkeys(node.inputs) if shapes[j] == shapes[i]] if readers \
        else [None]
    for j in options:
        remap = {k: (k if k < i else k - 1) for k in range(len(g.nodes) + 1) if k != i}
        remap[i] = remap[j] if j is not None else None
        nodes = tuple(Node(n.op, tuple(remap[k] for k in n.inputs), n.attrs)
                      for k, n in enumerate(g.nodes, 1) if k != i)
        graph = replace(g, nodes=nodes)
        if graph.shapes() is not None:
            yield graph


def write_repro(seed: int, out: Path) -> Path:
    """Reduce fuzz case `seed` and write `out/repro_<seed>.py`."""
    case = draw_case(seed)
    first = run_case(case)
    small = reduce_case(case, first.status) if first.failed else case
    outcome = run_case(small)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"repro_{seed}.py"
    path.write_text(repro_script(small, outcome))
    return path


def repro_script(case: Case, outcome) -> str:
    g, status, detail = case.graph, outcome.status, outcome.detail
    y = (f"torch.randint(0, {g.outputs}, ({g.input_shape[0]},), generator=gen)"
         if g.loss == "cross_entropy" else f"torch.randn(({g.input_shape[0]}, {g.outputs}), "
                                           "generator=gen)")
    found = "\n".join(f"#   {line}" for line in detail.splitlines()[:12])
    root = Path(__file__).resolve().parents[2]
    return f'''"""Fuzz seed {case.seed} (tools/fuzzing), reduced: {status}.

What the fuzzer saw:
{found}

Run it with `python {f"repro_{case.seed}.py"}`: it trains the model below through the generated
C with every rewrite pass on, and with {', '.join(case.disabled) or 'none'} switched off, and
judges each against PyTorch in float64 (ubitrain.fidelity.referee).
"""
import sys

sys.path.insert(0, {str(root)!r})  # the checkout whose fuzzer wrote it, for its tools/
{PRELUDE}
import ubitrain as ub
from tools.fuzzing.case import first_difference
from tools.fuzzing.graphs import vary_norm_parameters
from ubitrain.fidelity.referee import judge

{source(g)}

torch.manual_seed({case.seed})
model = Net()
vary_norm_parameters(model, {case.seed})
gen = torch.Generator().manual_seed({case.seed * 1000 + outcome.draw})
scale = float(torch.empty(()).uniform_(0.5, 2.0, generator=gen))
batches = []
for _ in range({case.steps}):
    x = torch.randn({tuple(g.input_shape)}, generator=gen) * scale
    batches.append((x, {y}))
optimizer = ub.{case.optimizer!r}
runs = []
for disabled in {tuple(dict.fromkeys(((), tuple(case.disabled))))!r}:
    verdict = judge(model, batches, optimizer, f"build/repro_{case.seed}_{{len(disabled)}}",
                    loss={g.loss!r}, seed={case.seed}, disable_passes=disabled)
    print(f"passes off: {{', '.join(disabled) or 'none'}}:", verdict.summary())
    runs.append(verdict)
if len(runs) == 2:
    print("first bit that differs between the two:", first_difference(*runs))
'''
