"""`ubitrain demo --sparse`: transfer learning on the device with a sparse update.

The digits CNN is pre-trained in PyTorch on the digits 0-4 only (the "factory" model). The
device then learns the digits 5-9 from its own data through the generated C, updating only
the last convolution and the classifier (`ub.SparseUpdate(last_layers=2)`): the backward
pass stops there, so nothing before that convolution is kept for it. (Training every bias
as well keeps the whole backward chain, and the arena barely shrinks.) The demo prints
accuracy on the new digits before and after, the same fine-tuning in PyTorch, and the arena
of the sparse step against a full update.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch

import ubitrain as ub
from ubitrain.zoo import DigitsCNN

from .data import BATCH, accuracy, epoch_batches, load_data, predict_padded, progress_bar

RULE = ub.SparseUpdate(last_layers=2)


def _pretrain(model, x, y, epochs: int, seed: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in epoch_batches(len(x), BATCH, epochs, seed):
        for idx in epoch:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x[idx])),
                                              torch.from_numpy(y[idx])).backward()
            opt.step()


def run_sparse_demo(epochs: int = 4, out_dir="build/demo_sparse", seed: int = 0,
                    progress: bool = True, log=print) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = load_data(seed)
    old, new = y_train < 5, y_train >= 5
    new_test = y_test >= 5
    model = DigitsCNN().train()
    _pretrain(model, x_train[old], y_train[old], epochs=4, seed=seed)

    def eval_new(predict):
        return accuracy(predict_padded(predict, x_test[new_test], BATCH), y_test[new_test])

    def torch_predict(m):
        def predict(chunk):
            m.eval()
            with torch.no_grad():
                out = m(torch.from_numpy(chunk)).numpy()
            m.train()
            return out
        return predict

    before = eval_new(torch_predict(model))
    log(f"pre-trained on digits 0-4 in PyTorch; accuracy on the new digits 5-9: {before:.2%}")

    x_new, y_new = x_train[new], y_train[new]
    example = (torch.from_numpy(x_new[:BATCH]),)
    labels = torch.from_numpy(y_new[:BATCH])
    optimizer = ub.SGD(lr=0.05, momentum=0.9)
    bars = None if progress else False  # compile and build bars: on a terminal, unless off
    start = time.perf_counter()
    pkg = ub.compile(copy.deepcopy(model), example, labels, optimizer=optimizer,
                     trainable=RULE, out_dir=out_dir, progress=bars)
    full = ub.compile(copy.deepcopy(model), example, labels, optimizer=optimizer,
                      out_dir=Path(out_dir) / "full_update", progress=bars)
    compile_s = time.perf_counter() - start
    log(f"sparse update trains {len(pkg.trainable)} of "
        f"{len(list(model.parameters()))} tensors ({', '.join(pkg.trainable)})")
    log(f"arena: sparse {pkg.memory_plan.arena_bytes:,} B vs full update "
        f"{full.memory_plan.arena_bytes:,} B "
        f"({full.memory_plan.arena_bytes / pkg.memory_plan.arena_bytes:.1f}x less)")
    trainer = pkg.build(seed=seed, progress=bars)

    reference = copy.deepcopy(model)
    names = set(pkg.trainable)
    for name, p in reference.named_parameters():
        p.requires_grad_(name in names)
    ref_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad],
                              lr=0.05, momentum=0.9)
    for e, epoch in enumerate(epoch_batches(len(x_new), BATCH, epochs, seed + 1)):
        losses = []
        for idx in progress_bar(epoch, f"C fine-tune {e + 1}/{epochs}", progress):
            losses.append(trainer.step(x_new[idx], y_new[idx]))
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(reference(torch.from_numpy(x_new[idx])),
                                              torch.from_numpy(y_new[idx])).backward()
            ref_opt.step()
        log(f"[generated C] fine-tune epoch {e + 1}/{epochs}  loss {np.mean(losses):.4f}  "
            f"accuracy on digits 5-9 {eval_new(trainer.predict):.2%}")
    after, torch_after = eval_new(trainer.predict), eval_new(torch_predict(reference))
    log(f"digits 5-9: {before:.2%} before, {after:.2%} after fine-tuning in C "
        f"(PyTorch, same sparse update: {torch_after:.2%}); compile {compile_s:.1f} s")
    return dict(before=before, after=after, torch_after=torch_after,
                sparse_arena=pkg.memory_plan.arena_bytes,
                full_arena=full.memory_plan.arena_bytes, trainable=pkg.trainable)
