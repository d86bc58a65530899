"""`ubitrain passes`: the declared pipeline of a precision, step by step."""

from __future__ import annotations

from .common import PRECISIONS, formatter

PASSES_HELP = """\
List the steps of the compile pipeline of a precision, in the order they run. The rewrite
passes (marked *) change how the step is computed, never what; --disable-passes switches
them off by name, each stating whether the step then stays the same bit for bit."""


def add_parser(sub):
    p = sub.add_parser("passes", help="list the steps of the compile pipeline",
                       description=PASSES_HELP, formatter_class=formatter)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")


def run(args) -> int:
    from ..pipeline import PIPELINES, Rewrite

    pipeline = PIPELINES[args.precision]
    print(f"the {pipeline.precision} pipeline; lowering (once per number of micro-batches):")
    for step in pipeline.steps:
        if step is pipeline.finishing[0]:
            print("finishing:")
        if isinstance(step, Rewrite):
            claim = "bit-exact" if step.bit_exact else "not bit-exact"
            print(f"  * {step.name} ({claim}): {step.summary}")
        else:
            print(f"    {step.name}: {step.summary}")
    return 0
