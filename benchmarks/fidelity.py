"""Real-model fidelity: models nobody here wrote, trained 3 steps through the generated C and
judged step by step against PyTorch in float64 (ubitrain.fidelity.referee).

    python benchmarks/fidelity.py [--models lenet5 resnet18 ...] [--batches 1 4 8]
                                  [--out results/fidelity.json]

Per model and batch: parameters, the verdict (match / near kink / mismatch / error), the
closest check as error / tolerance (below 1 is a pass; "error" is the C's largest
difference from float64, "tolerance" 8x float32 PyTorch's own plus 4 roundings), how many
near-kink activations took the C's side in PyTorch's runs (fidelity/sides.py: a run with
elements near a kink is judged again with the C's side replayed), and the seconds the whole
judgement took (compile, C build, 3 steps, 4 PyTorch runs a step; a replay builds again).
The README's table comes from this script.
"""

import argparse
import tempfile
import time
import traceback
import warnings

import torch
from _results import write_json

import ubitrain as ub
from tools.real_models import REAL_MODELS, batches, real_model
from ubitrain.fidelity.referee import judge


def run(model, batch: int) -> dict:
    torch.manual_seed(0)
    net = model.make()
    params = sum(p.numel() for p in net.parameters())
    start = time.perf_counter()
    row = dict(model=model.name, batch=batch, params=params, notes=model.notes)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            verdict = judge(net, batches(model, batch), ub.SGD(**model.optimizer), tmp)
        closest = max(verdict.checks, key=lambda c: c.error / max(c.tolerance, 1e-300))
        row.update(verdict=verdict.status, closest=str(closest),
                   ratio=closest.error / max(closest.tolerance, 1e-300),
                   near_kinks={str(k): v for k, v in verdict.near_kinks.items()},
                   replayed=sum(verdict.replayed.values()),
                   unreplayed={str(k): v for k, v in verdict.unreplayed.items()},
                   failures=[str(c) for c in verdict.failures])
    except Exception as err:  # noqa: BLE001 - the table says what failed, and goes on
        row.update(verdict="error", detail="".join(
            traceback.format_exception_only(type(err), err)).strip()[:600])
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[m.name for m in REAL_MODELS])
    parser.add_argument("--batches", nargs="+", type=int, default=None)
    parser.add_argument("--out", default="results/fidelity.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rows = []
    print(f"{'model':16} {'batch':>5} {'params':>10}  {'verdict':10} {'closest':>8} "
          f"{'replayed':>8} {'s':>6}")
    for name in args.models:
        model = real_model(name)
        for batch in args.batches or model.batches:
            row = run(model, batch)
            rows.append(row)
            ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
            print(f"{row['model']:16} {batch:>5} {row['params']:>10,}  {row['verdict']:10} "
                  f"{ratio:>8} {row.get('replayed', '-'):>8} {row['seconds']:>6}", flush=True)
            for line in row.get("failures", [])[:5] + [row.get("detail", "")]:
                if line:
                    print(f"    {line}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
