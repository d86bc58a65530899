"""Can the referee fail? The real models and the fuzzer's random models built with
deliberately wrong C, one plausible defect at a time (tools/mutants/: a gradient times 1.01,
a dropped term of a gradient sum, BatchNorm's eps or momentum off, a reduction loop one
short, a ReLU mask's < as <=, a missing weight-decay term, an in-place share that reads an
overwritten value), each judged by the referee as `judge` does.

    python benchmarks/mutants.py [--models lenet5 mobilenet_v2 ...] [--batches 1 4 8]
        [--fuzz-seeds 0:100 ...] [--mutants bn_eps ...] [--steps 2] [--every-step]
        [--target aarch64-neon] [--out results/mutants.json]
    python benchmarks/mutants.py --precision int8 [--target aarch64-neon] [--mutants ...]

Per model and batch, first the C as generated ("baseline": it must match, or the kills say
nothing), then each mutant's outcome: caught ("mismatch", or "stops": the C returned an
error status), missed ("match", "near kink"), not caught because no referee could ("same":
every number the referee reads bit for bit the baseline's; "rounding": within its rounding
floor; "f32 error": no number further from float64 than float32 PyTorch's, or the
baseline's, without headroom), or "-" (the model has nothing the defect applies to: not
exercised); a miss says how far it is, in units of float32's own error. Then the kill
rate per mutant and per model, over the runs that exercised it. Step 1's PyTorch runs are
shared by a model's mutants, and a mutant caught at step 1 is not run further
(tools/mutants/run.py; `--every-step` runs it through every step). A real model trains with
SGD, momentum 0.9 and weight decay 1e-4 (so that the weight-decay defect has a term to
drop), lr 0.05, on the real-model suite's inputs (tools/real_models.py); a fuzz seed
(`--fuzz-seeds A:B`, as `python -m tools.fuzzing`) on its own case: its model, loss,
optimizer and data, every pass on (variant A).

`--precision int8`: the int8 mutants (tools/mutants/int8_defects.py: a rescale shift off by
one, round half wrongly, saturation at -128, a residual's backward sum dropping a term, the
ReLU mask's < as <=, a reduction one short, the update's mu off by one) on the int8 test
models (tools/int8_models.py), each caught if its step differs in one bit from the numpy
reference. `--target` (either precision): the same C built by a cross target's compiler,
run under QEMU.
"""

import tempfile
import time
import traceback

import _real_model_cli as cli
import torch
from _results import write_json

import ubitrain as ub
from tools import int8_models
from tools.fuzzing.__main__ import parse_seeds
from tools.fuzzing.case import clear_batches, draw_case
from tools.fuzzing.graphs import instantiate
from tools.mutants import BASELINE, INT8_MUTANTS, MUTANTS, judge_int8_mutants, judge_mutants, mutant
from tools.real_models import batches, real_model

SHORT = {"mismatch": "caught", "stops": "stops", "match": "MISSED", "near kink": "kink?",
         "unchanged": "same", "below rounding": "rounding",
         "below float32's error": "f32 error", "not exercised": "-",
         "error": "ERROR"}
# not caught, and no referee comparing with float32 PyTorch could have
APART = ("unchanged", "below rounding", "below float32's error")
REAL_OPTIMIZER = ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)


def real_subjects(names, sizes, steps, every_step=False, target="host"):
    """(model, batch, run(mutants, folder)) per real model and batch size."""
    where = {} if target == "host" else dict(target=target)
    for name in names:
        model = real_model(name)
        for batch in sizes:
            def run(mutants, tmp, model=model, batch=batch):
                torch.manual_seed(0)
                return judge_mutants(mutants, model.make(), batches(model, batch, steps),
                                     REAL_OPTIMIZER, tmp, every_step=every_step, **where)
            yield name, batch, run


def fuzz_subjects(seeds, every_step=False, target="host"):
    where = {} if target == "host" else dict(target=target)
    for seed in seeds:
        case = draw_case(seed)

        def run(mutants, tmp, case=case):
            model = instantiate(case.graph, case.seed)
            data, _ = clear_batches(case, model)
            return judge_mutants(mutants, model, data, case.optimizer, tmp, case.graph.loss,
                                 case.seed, every_step,
                                 trainable=list(case.trainable or []) or None, **where)
        yield f"fuzz {seed}", case.graph.input_shape[0], run


def int8_subjects(target):
    """The int8 test models (tools/int8_models.py) as tests/test_int8_graph.py trains them:
    4 steps, mu 5 then 4; every site counted, and two of them with adaptive rescaling."""
    cases = [(i, False) for i in range(len(int8_models.MODELS))] + [(2, True), (4, True)]
    for i, adaptive in cases:
        def run(mutants, tmp, i=i, adaptive=adaptive):
            torch.manual_seed(0)
            config = ub.NITI(mu=(5, 4), milestones=(2,), adaptive_rescale=adaptive,
                             max_interval=4)
            return judge_int8_mutants(mutants, int8_models.MODELS[i](),
                                      int8_models.int8_batches(4), config, tmp, target)
        yield int8_models.MODEL_IDS[i] + ("-adaptive" if adaptive else ""), 4, run


def main():
    parser = cli.parser(__doc__, "results/mutants.json", batches=(4,))
    parser.add_argument("--fuzz-seeds", type=parse_seeds, nargs="+", default=[],
                        help="A:B (A to B-1) or N (0 to N-1), several")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--target", default="host",
                        help="where the C runs: a cross target's under QEMU (fp32: without "
                             "the C's sides replayed, so a step near a kink stays undecided)")
    parser.add_argument("--mutants", nargs="+")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--every-step", action="store_true",
                        help="judge every mutant through every step, even one caught at "
                             "the first (tools/mutants/run.py first_step_mismatch)")
    args = cli.parse(parser)
    suite = INT8_MUTANTS if args.precision == "int8" else MUTANTS
    mutants = [BASELINE] + [mutant(n, suite) for n in args.mutants or [m.name for m in suite]]
    if args.precision == "int8":
        subjects = list(int8_subjects(args.target))
    else:
        subjects = [*real_subjects(args.models, args.batches, args.steps, args.every_step,
                                   args.target),
                    *fuzz_subjects([s for r in args.fuzz_seeds for s in r], args.every_step,
                                   args.target)]
    rows = []
    print(f"{'model':18} {'batch':>5} " + " ".join(f"{m.name[:13]:>13}" for m in mutants)
          + "      s")
    for name, batch, run in subjects:
        start = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                results = run(mutants, tmp)
        except Exception as err:  # noqa: BLE001 - an unsupported fuzz model: said, skipped
            print(f"{name:18} {batch:>5} not compiled: "
                  + traceback.format_exception_only(type(err), err)[-1].strip()[:120])
            continue
        seconds = round(time.perf_counter() - start, 1)
        for r in results:
            rows.append(dict(model=name, batch=batch, precision=args.precision,
                             target=args.target, mutant=r.mutant, exercised=r.exercised,
                             where=r.where, status=r.status, caught=r.caught,
                             summary=r.summary, seconds=seconds))
        cells = [r.status if r.mutant == BASELINE.name else SHORT.get(r.status, r.status)
                 for r in results]
        print(f"{name:18} {batch:>5} " + " ".join(f"{c:>13}" for c in cells)
              + f" {seconds:>6}", flush=True)
        write_json(args.out, rows, say=False)  # so far: a run stopped early keeps its rows
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
    print("\nkill rate per mutant (caught / exercised and changing a number beyond rounding; "
          "runs where it changes none, or only below rounding or float32 PyTorch's own error; "
          "runs that do not exercise it)")
    for m in mutants:
        mine = [r for r in rows if r["mutant"] == m.name]
        ran = [r for r in mine if r["exercised"] and r["status"] not in APART]
        same = [f"{r['model']} b{r['batch']}" for r in mine if r["status"] == "unchanged"]
        tiny = [f"{r['model']} b{r['batch']}" for r in mine
                if r["status"] == "below rounding"]
        vague = [f"{r['model']} b{r['batch']}" for r in mine
                 if r["status"] == "below float32's error"]
        idle = [f"{r['model']} b{r['batch']}" for r in mine if not r["exercised"]]
        print(f"  {m.name:20} {sum(r['caught'] for r in ran)}/{len(ran)}"
              + ("   EXERCISED BY NO MODEL" if not ran and not same and not tiny and not vague
                 else "")
              + (f"   changes no number of: {', '.join(same)}" if same else "")
              + (f"   changes numbers below rounding on: {', '.join(tiny)}" if tiny else "")
              + (f"   changes numbers within float32 PyTorch's own error on: {', '.join(vague)}"
                 if vague else "")
              + (f"   not exercised by: {', '.join(idle)}" if idle else ""))
    print("kill rate per model (caught / exercised, over its batches)")
    group = {r["model"]: "fuzz seeds" if r["model"].startswith("fuzz ") else r["model"]
             for r in rows}
    for name in dict.fromkeys(group.values()):
        ran = [r for r in rows if group[r["model"]] == name and r["exercised"]
               and r["mutant"] != BASELINE.name and r["status"] not in APART]
        print(f"  {name:20} {sum(r['caught'] for r in ran)}/{len(ran)}")


if __name__ == "__main__":
    main()
