"""Can the referee fail? The real models built with deliberately wrong C, one plausible defect
at a time (tools/mutants/: a gradient times 1.01, a dropped term of a gradient sum,
BatchNorm's eps or momentum off, a reduction loop one short, a ReLU mask's < as <=, a
missing weight-decay term, an in-place share that reads an overwritten value), each judged
by the referee as `judge` does.

    python benchmarks/mutants.py [--models lenet5 mobilenet_v2 ...] [--mutants bn_eps ...]
        [--batch 4] [--steps 2] [--out results/mutants.json]

Per model, first the C as generated ("baseline": it must match, or the kills say nothing),
then each mutant's outcome: caught ("mismatch", or "stops": the C returned an error
status), missed ("match", "near kink"), or "-" (the model has nothing the defect applies
to: not exercised). Then the kill rate per mutant and per model, over the runs that
exercised it. SGD with momentum 0.9 and weight decay 1e-4 (so that the weight-decay defect
has a term to drop), lr 0.05, the real-model suite's inputs (tools/real_models.py).
"""

import argparse
import tempfile
import time
import warnings

import torch
from _results import write_json

import ubitrain as ub
from tools.mutants import BASELINE, MUTANTS, judge_mutants, mutant
from tools.real_models import REAL_MODELS, batches, real_model

SHORT = {"mismatch": "caught", "stops": "stops", "match": "MISSED", "near kink": "kink?",
         "not exercised": "-", "error": "ERROR"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[m.name for m in REAL_MODELS])
    parser.add_argument("--mutants", nargs="+", default=[m.name for m in MUTANTS])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="results/mutants.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    mutants = [BASELINE] + [mutant(n) for n in args.mutants]
    optimizer = ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)
    rows = []
    print(f"{'model':18} " + " ".join(f"{m.name[:13]:>13}" for m in mutants) + "      s")
    for name in args.models:
        model = real_model(name)
        torch.manual_seed(0)
        net = model.make()
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            results = judge_mutants(mutants, net, batches(model, args.batch, args.steps),
                                    optimizer, tmp)
        seconds = round(time.perf_counter() - start, 1)
        for r in results:
            rows.append(dict(model=name, batch=args.batch, steps=args.steps, mutant=r.mutant,
                             exercised=r.exercised, where=r.where, status=r.status,
                             caught=r.caught, summary=r.summary))
        cells = [r.status if r.mutant == BASELINE.name else SHORT.get(r.status, r.status)
                 for r in results]
        print(f"{name:18} " + " ".join(f"{c:>13}" for c in cells)
              + f" {seconds:>6}", flush=True)
        for r in results:
            if r.exercised and not r.caught and (r.mutant != BASELINE.name
                                                 or r.status != "match"):
                print(f"    {r.mutant} ({r.where}): {(r.summary or '-').splitlines()[0][:160]}")
    print("\nkill rate per mutant (caught / exercised; models that do not exercise it)")
    for m in mutants[1:]:
        mine = [r for r in rows if r["mutant"] == m.name]
        ran = [r for r in mine if r["exercised"]]
        idle = [r["model"] for r in mine if not r["exercised"]]
        print(f"  {m.name:20} {sum(r['caught'] for r in ran)}/{len(ran)}"
              + (f"   not exercised by: {', '.join(idle)}" if idle else "")
              + ("   EXERCISED BY NO MODEL" if not ran else ""))
    print("kill rate per model")
    for name in args.models:
        ran = [r for r in rows if r["model"] == name and r["exercised"]
               and r["mutant"] != BASELINE.name]
        print(f"  {name:20} {sum(r['caught'] for r in ran)}/{len(ran)}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
