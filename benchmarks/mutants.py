"""Can the referee fail? The real models and the fuzzer's random models built with
deliberately wrong C, one plausible defect at a time (tools/mutants/: a gradient times 1.01,
a dropped term of a gradient sum, BatchNorm's eps or momentum off, a reduction loop one
short, a ReLU mask's < as <=, a missing weight-decay term, an in-place share that reads an
overwritten value), each judged by the referee as `judge` does.

    python benchmarks/mutants.py [--models lenet5 mobilenet_v2 ...] [--batches 1 4 8]
        [--fuzz-seeds 0:100] [--mutants bn_eps ...] [--steps 2] [--out results/mutants.json]

Per model and batch, first the C as generated ("baseline": it must match, or the kills say
nothing), then each mutant's outcome: caught ("mismatch", or "stops": the C returned an
error status), missed ("match", "near kink"), or "-" (the model has nothing the defect
applies to: not exercised). Then the kill rate per mutant and per model, over the runs that
exercised it. A real model trains with SGD, momentum 0.9 and weight decay 1e-4 (so that the
weight-decay defect has a term to drop), lr 0.05, on the real-model suite's inputs
(tools/real_models.py); a fuzz seed (`--fuzz-seeds A:B`, as `python -m tools.fuzzing`) on
its own case: its model, loss, optimizer and data, every pass on (variant A).
"""

import tempfile
import time
import traceback

import _real_model_cli as cli
import torch
from _results import write_json

import ubitrain as ub
from tools.fuzzing.__main__ import parse_seeds
from tools.fuzzing.case import clear_batches, draw_case
from tools.fuzzing.graphs import instantiate
from tools.mutants import BASELINE, MUTANTS, judge_mutants, mutant
from tools.real_models import batches, real_model

SHORT = {"mismatch": "caught", "stops": "stops", "match": "MISSED", "near kink": "kink?",
         "not exercised": "-", "error": "ERROR"}
REAL_OPTIMIZER = ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)


def real_subjects(names, sizes, steps):
    """(model, batch, what judge_mutants takes) per real model and batch size."""
    for name in names:
        model = real_model(name)
        for batch in sizes:
            def subject(model=model, batch=batch):
                torch.manual_seed(0)
                return dict(model=model.make(), batches=batches(model, batch, steps),
                            optimizer=REAL_OPTIMIZER)
            yield name, batch, subject


def fuzz_subjects(seeds):
    for seed in seeds:
        case = draw_case(seed)

        def subject(case=case):
            model = instantiate(case.graph, case.seed)
            data, _ = clear_batches(case, model)
            return dict(model=model, batches=data, optimizer=case.optimizer,
                        loss=case.graph.loss, seed=case.seed,
                        trainable=list(case.trainable) if case.trainable else None)
        yield f"fuzz {seed}", case.graph.input_shape[0], subject


def main():
    parser = cli.parser(__doc__, "results/mutants.json", batches=(4,))
    parser.add_argument("--fuzz-seeds", type=parse_seeds, default=range(0))
    parser.add_argument("--mutants", nargs="+", default=[m.name for m in MUTANTS])
    parser.add_argument("--steps", type=int, default=2)
    args = cli.parse(parser)
    mutants = [BASELINE] + [mutant(n) for n in args.mutants]
    rows = []
    print(f"{'model':18} {'batch':>5} " + " ".join(f"{m.name[:13]:>13}" for m in mutants)
          + "      s")
    subjects = [*real_subjects(args.models, args.batches, args.steps),
                *fuzz_subjects(args.fuzz_seeds)]
    for name, batch, subject in subjects:
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                results = judge_mutants(mutants, out_dir=tmp, **subject())
        except Exception as err:  # noqa: BLE001 - an unsupported fuzz model: said, skipped
            print(f"{name:18} {batch:>5} not compiled: "
                  + traceback.format_exception_only(type(err), err)[-1].strip()[:120])
            continue
        seconds = round(time.perf_counter() - start, 1)
        for r in results:
            rows.append(dict(model=name, batch=batch, steps=args.steps, mutant=r.mutant,
                             exercised=r.exercised, where=r.where, status=r.status,
                             caught=r.caught, summary=r.summary, seconds=seconds))
        cells = [r.status if r.mutant == BASELINE.name else SHORT.get(r.status, r.status)
                 for r in results]
        print(f"{name:18} {batch:>5} " + " ".join(f"{c:>13}" for c in cells)
              + f" {seconds:>6}", flush=True)
        for r in results:
            if r.exercised and not r.caught and (r.mutant != BASELINE.name
                                                 or r.status != "match"):
                print(f"    {r.mutant} ({r.where}): {(r.summary or '-').splitlines()[0][:160]}")
    summarize(rows, mutants[1:])
    write_json(args.out, rows)


def summarize(rows, mutants):
    """The kill rate per mutant (naming the runs that do not exercise it), and per model
    (the fuzz seeds together), over the runs whose baseline matched."""
    valid = {(r["model"], r["batch"]) for r in rows
             if r["mutant"] == BASELINE.name and r["status"] == "match"}
    bad = sorted({(r["model"], r["batch"]) for r in rows} - valid)
    if bad:
        print(f"\nbaseline not a match, its mutants not counted: {bad}")
    rows = [r for r in rows if (r["model"], r["batch"]) in valid]
    print("\nkill rate per mutant (caught / exercised; runs that do not exercise it)")
    for m in mutants:
        mine = [r for r in rows if r["mutant"] == m.name]
        ran = [r for r in mine if r["exercised"]]
        idle = [f"{r['model']} b{r['batch']}" for r in mine if not r["exercised"]]
        print(f"  {m.name:20} {sum(r['caught'] for r in ran)}/{len(ran)}"
              + ("   EXERCISED BY NO MODEL" if not ran else "")
              + (f"   not exercised by: {', '.join(idle)}" if idle else ""))
    print("kill rate per model (caught / exercised, over its batches)")
    group = {r["model"]: "fuzz seeds" if r["model"].startswith("fuzz ") else r["model"]
             for r in rows}
    for name in dict.fromkeys(group.values()):
        ran = [r for r in rows if group[r["model"]] == name and r["exercised"]
               and r["mutant"] != BASELINE.name]
        print(f"  {name:20} {sum(r['caught'] for r in ran)}/{len(ran)}")


if __name__ == "__main__":
    main()
