"""How tight is the referee? Per real model, each check's tolerance / error, with the float32
runs that set the tolerance pinned to float64's kink branches (the referee since issue #39)
and unpinned (before it: a float32 run that put one element on the other side of a ReLU6
kink could widen a tolerance a hundredfold).

    python benchmarks/referee_tolerance.py [--models mobilenet_v2 lenet5 ...]
        [--batches 1 4 8] [--steps 1] [--lr 1.0] [--momentum 0.0]
        [--out results/referee_tolerance.json]

Each model is compiled once (with the call trace, so that either referee can replay the C's
side of near-kink elements) and judged twice from a fresh build: as `judge` does it (a
first look; a step left "near kink" judged again with the C's sides replayed), once
unpinned, once pinned. Per run: the verdict; "tightest", the smallest tolerance / error over
the checks (1 is the edge: below it a check fails); "median", over the checks whose error is
not 0; and, after, how many checks' tolerances shrank more than 2x and the largest factor.
The default is the issue's setting: one step of SGD with lr 1 on the real-model suite's
inputs (tools/real_models.py).
"""

import statistics
import tempfile
import time
import traceback

import _real_model_cli as cli
import torch
from _results import write_json

import ubitrain as ub
from tools.mutants import decide
from tools.mutants.reuse import SharedReference
from tools.real_models import batches, real_model
from ubitrain.pipeline import CallTrace


def ratios(verdict) -> dict:
    r = [c.tolerance / c.error for c in verdict.checks if c.error > 0]
    return dict(verdict=verdict.status, tightest=min(r, default=float("inf")),
                median=statistics.median(r) if r else float("inf"),
                replayed=sum(verdict.replayed.values()),
                unpinned={str(k): v for k, v in getattr(verdict, "unpinned", {}).items()},
                failures=[str(c) for c in verdict.failures][:5])


def run(model, batch: int, steps: int, optimizer) -> dict:
    torch.manual_seed(0)
    net = model.make()
    data = batches(model, batch, steps)
    row = dict(model=model.name, batch=batch, steps=steps)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            *xs, y = data[0]
            pkg = ub.compile(net, tuple(xs), y, optimizer=optimizer, out_dir=tmp,
                             instruments=[CallTrace()])
            # the float64 runs of step 1 (the step, its flips) are the same for both
            reference = SharedReference(net, optimizer, "cross_entropy", pkg.trainable)
            before, after = (decide(pkg, reference, data, pin) for pin in (False, True))
        row["before"], row["after"] = ratios(before), ratios(after)
        old = {(c.step, c.name): c.tolerance for c in before.checks}
        shrink = [old[(c.step, c.name)] / c.tolerance for c in after.checks
                  if (c.step, c.name) in old and c.tolerance > 0]
        row["shrunk"] = sum(f > 2 for f in shrink)
        row["largest_shrink"] = max(shrink, default=1.0)
    except Exception as err:  # noqa: BLE001 - the table says what failed, and goes on
        row["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()[:600]
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main():
    parser = cli.parser(__doc__, "results/referee_tolerance.json")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.0)
    args = cli.parse(parser)
    optimizer = ub.SGD(lr=args.lr, momentum=args.momentum)
    rows = []
    print(f"{'model':18} {'batch':>5}  {'before':28}  {'after':28}  {'shrunk':>6} "
          f"{'max':>7} {'s':>6}")

    def cell(r):
        return (f"{r['verdict']:9} {r['tightest']:7.2f} {r['median']:9.1f}"
                + (f" r{r['replayed']}" if r["replayed"] else ""))

    for name in args.models:
        model = real_model(name)
        for batch in args.batches:
            row = run(model, batch, args.steps, optimizer)
            rows.append(row)
            if "error" in row:
                print(f"{name:18} {batch:>5}  error: {row['error']}", flush=True)
                continue
            print(f"{name:18} {batch:>5}  {cell(row['before']):28}  {cell(row['after']):28}  "
                  f"{row['shrunk']:>6} {row['largest_shrink']:7.1f} {row['seconds']:>6}",
                  flush=True)
            for line in row["after"]["failures"] + [str(row["after"]["unpinned"] or "")]:
                if line:
                    print(f"    {line}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
