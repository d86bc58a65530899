"""INT8 (NITI) training against fp32 on scikit-learn's digits: test accuracy of the same
network trained through the generated C in both precisions, on the same batches from the
same initial weights, side by side.

    python benchmarks/int8_accuracy.py [--models residual bias_free] [--epochs 8]
                                       [--seeds 0 1 2] [--micro-batches 2 4]
                                       [--out results/int8_accuracy.json]

Models (ubitrain.zoo): "residual" is DigitsResidualCNN (biases, BatchNorm, a depthwise conv
in a residual block, a pointwise conv); "bias_free" is DigitsCNNNiti (the demo's CNN without
BatchNorm and biases). fp32: SGD (lr 0.05, momentum 0.9, weight decay 1e-4), BatchNorm
trained with batch statistics. int8: the step derived from the float graph
(pipeline/int8.py), each BatchNorm folded into its conv with its running statistics (and,
"int8_batch_norm", NITI(batch_norm="integer"): NITI's integer BatchNorm with batch
statistics instead),
NITI's update with mu 5, 4, 3 over the thirds of training (--mu); counted (every shift reduced)
and adaptive rescaling; "_channel": an exponent per output channel of each weight
(NITI(weight_exponents="channel")) instead of one per tensor. "fp32_folded" (nets with
BatchNorm): the int8 run's network, each BatchNorm folded into its conv at the start,
trained in fp32: what folding alone costs. "_micro<k>" (--micro-batches): the int8 run (and
on nets with BatchNorm the integer BatchNorm one) with each batch as k micro-batches
(niti/micro_batches.py): what micro-batching costs against the whole batch.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import tempfile
from pathlib import Path

import _results  # noqa: F401 - the repository's root on sys.path
import numpy as np
import torch

import ubitrain as ub
from ubitrain.demos.data import BATCH, epoch_batches, load_data
from ubitrain.demos.int8 import MU, niti_config, train_and_score
from ubitrain.training.batch_norm_folding import batch_norms, fold_batch_norms
from ubitrain.zoo import DigitsCNNNiti, DigitsResidualCNN

MODELS = {"residual": DigitsResidualCNN, "bias_free": DigitsCNNNiti}


def int8_package(model, x0, y0, config, out_dir, micro_batches=1):
    return ub.compile(model, (x0,), y0, precision="int8", optimizer=config, out_dir=out_dir,
                      progress=False, micro_batches=micro_batches)


def run(model_name: str, epochs: int, seed: int, mu, work: Path, micro=()) -> dict:
    x_train, y_train, x_test, y_test = load_data(seed)
    batches = epoch_batches(len(x_train), BATCH, epochs, seed)
    total = sum(len(b) for b in batches)
    torch.manual_seed(seed)
    model = MODELS[model_name]()
    first = batches[0][0]
    x0, y0 = torch.from_numpy(x_train[first]), torch.from_numpy(y_train[first])
    data = (batches, x_train, y_train, x_test, y_test, False, lambda *_: None)
    fp32 = ub.compile(copy.deepcopy(model), (x0,), y0,
                      optimizer=ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
                      out_dir=work / f"{model_name}_fp32", progress=False)
    out = {"fp32": train_and_score("fp32", fp32, *data)["accuracy"]}
    if batch_norms(model):  # what folding costs in float: the folded net trained in fp32
        folded = ub.compile(fold_batch_norms(model), (x0,), y0,
                            optimizer=ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
                            out_dir=work / f"{model_name}_fp32_folded", progress=False)
        out["fp32_folded"] = train_and_score("fp32 folded", folded, *data)["accuracy"]
    runs = [("int8", False, "fold", "tensor", 1), ("int8_adaptive", True, "fold", "tensor", 1),
            ("int8_channel", False, "fold", "channel", 1)]
    if batch_norms(model):  # NITI's integer BatchNorm with batch statistics instead
        runs += [("int8_batch_norm", False, "integer", "tensor", 1),
                 ("int8_batch_norm_channel", False, "integer", "channel", 1)]
    whole = [r for r in runs if r[0] in ("int8", "int8_batch_norm")]
    for k in micro:  # those again over k micro-batches
        runs += [(f"{key}_micro{k}", *how[:-1], k) for key, *how in whole]
    for key, adaptive, norm, exponents, k in runs:
        config = dataclasses.replace(niti_config(total, adaptive, mu), batch_norm=norm,
                                     weight_exponents=exponents)
        pkg = int8_package(copy.deepcopy(model), x0, y0, config, work / f"{model_name}_{key}",
                           k)
        out[key] = train_and_score(key, pkg, *data)["accuracy"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--mu", nargs="+", type=int, default=list(MU),
                    help="NITI's mu for equal shares of the steps (default: %(default)s)")
    ap.add_argument("--micro-batches", nargs="*", type=int, default=[],
                    help="also train the int8 runs over each k micro-batches of the batch")
    ap.add_argument("--out", default="results/int8_accuracy.json")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            runs = [run(name, args.epochs, seed, args.mu, Path(tmp), args.micro_batches)
                    for seed in args.seeds]
            results[name] = runs
            mean = {k: 100 * np.mean([r[k] for r in runs]) for k in runs[0]}
            print(f"{name:<10} test accuracy over seeds {args.seeds}, {args.epochs} epochs: "
                  + ", ".join(f"{k} {v:.2f}%" for k, v in mean.items())
                  + f" | int8 - fp32 {mean['int8'] - mean['fp32']:+.2f} points, adaptive "
                  f"{mean['int8_adaptive'] - mean['fp32']:+.2f}", flush=True)
    _results.write_json(args.out, {"epochs": args.epochs, "seeds": args.seeds, "mu": args.mu,
                                   "micro_batches": args.micro_batches, "accuracy": results})


if __name__ == "__main__":
    main()
