"""BatchNorm under int8 (NITI) training: folded into the conv before it, or NITI's integer
BatchNorm with batch statistics (ubitrain/niti/batch_norm.py), by test accuracy on
scikit-learn's digits beside the same net in fp32 with PyTorch's BatchNorm.

    python benchmarks/int8_batch_norm.py [--seeds 0 1 2] [--epochs 8]
                                         [--out results/int8_batch_norm.json]

The int8 runs train with the numpy reference (fidelity/niti_reference.py), the spec the
generated C must equal bit for bit, so that the choice is measured before the integer
BatchNorm has kernels. DigitsResidualCNN (biases, 3 BatchNorms, a depthwise conv in a
residual block), batch 32, the same batches and initial weights in every run; fp32: SGD
lr 0.05, momentum 0.9, weight decay 1e-4 (PyTorch, one thread); int8: mu 5, 4, 3 over the
thirds, every shift reduced. Columns:
  fp32                 PyTorch, BatchNorm with batch statistics, evaluated with running ones
  fp32 folded          each BatchNorm folded into its conv at the start (what folding costs)
  int8 folded          the same folded net in int8
  int8 batch norm      the integer BatchNorm, evaluated with the running statistics as they
                       moved during training (momentum 0.1)
  int8 recalibrated    the same, its running statistics recomputed at the end from 20
                       training batches (their cumulative average), as tiny models' BN
                       recalibration does
"""

from __future__ import annotations

import argparse
import copy

import _results  # noqa: F401 - the repository's root on sys.path
import numpy as np
import torch
from _results import write_json

from ubitrain.demos.data import BATCH, accuracy, epoch_batches, load_data, predict_padded
from ubitrain.fidelity.niti_reference import NitiGraphReference
from ubitrain.niti.rescale import EXACT_COUNTED
from ubitrain.niti.update import niti_update
from ubitrain.training.batch_norm_folding import fold_batch_norms
from ubitrain.training.niti_module import integer_state, running_statistics
from ubitrain.zoo import DigitsResidualCNN

MU = (5, 4, 3)
RECALIBRATION_BATCHES = 20


def fp32(model, batches, data) -> float:
    x_train, y_train, x_test, y_test = data
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    model.train()
    for idx in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x_train[idx])),
                                          torch.from_numpy(y_train[idx])).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return accuracy(model(torch.from_numpy(x_test)).numpy(), y_test)


def int8(model, batches, data, recalibrate: bool) -> float:
    x_train, y_train, x_test, y_test = data
    example = torch.from_numpy(x_train[batches[0]])
    floats = {n: p.detach().numpy() for n, p in model.named_parameters()}
    params = integer_state(model, example, floats)
    reference = NitiGraphReference(model, example, EXACT_COUNTED)
    reference.running = running_statistics(model, example)
    for i, idx in enumerate(batches):
        mu = MU[i * len(MU) // len(batches)]
        _, grads = reference.step(x_train[idx], y_train[idx], params)
        params = {n: (niti_update(v, grads[n], mu).astype(v.dtype), e)
                  for n, (v, e) in params.items()}
    if recalibrate:
        reference.recalibrate([x_train[idx] for idx in batches[:RECALIBRATION_BATCHES]], params)
    return accuracy(predict_padded(lambda x: reference.predict(x, params), x_test, BATCH),
                    y_test)


def run(seed: int, epochs: int) -> dict:
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = data = load_data(seed)
    batches = [b for epoch in epoch_batches(len(x_train), BATCH, epochs, seed) for b in epoch]
    torch.manual_seed(seed)
    model = DigitsResidualCNN()
    folded = fold_batch_norms(model)
    return {"fp32": fp32(copy.deepcopy(model), batches, data),
            "fp32 folded": fp32(copy.deepcopy(folded), batches, data),
            "int8 folded": int8(folded, batches, data, False),
            "int8 batch norm": int8(model, batches, data, False),
            "int8 recalibrated": int8(model, batches, data, True)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="results/int8_batch_norm.json")
    args = parser.parse_args()
    rows = {}
    for seed in args.seeds:
        rows[seed] = run(seed, args.epochs)
        print(f"seed {seed}: " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in rows[seed].items()),
              flush=True)
    columns = list(next(iter(rows.values())))
    print("\n| seed | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for seed, row in rows.items():
        print(f"| {seed} | " + " | ".join(f"{100 * row[c]:.2f}%" for c in columns) + " |")
    mean = {c: float(np.mean([row[c] for row in rows.values()])) for c in columns}
    print("| mean | " + " | ".join(f"{100 * mean[c]:.2f}%" for c in columns) + " |")
    write_json(args.out, {"epochs": args.epochs, "mu": MU, "seeds": rows, "mean": mean})


if __name__ == "__main__":
    main()
