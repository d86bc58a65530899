"""`ubitrain demo --precision int8`: the digits CNN trained in NITI's integer-only int8 through
the generated C, side by side with the same network in fp32 (also generated C).

The network is the demo's CNN without BatchNorm and biases (zoo.DigitsCNNNiti), which NITI
has no integer form for. Both runs start from the same float weights (int8: quantized) and see
the same batches. Three runs: fp32 with SGD (lr 0.05, momentum 0.9, weight decay 1e-4), int8
with every shift reduced each step, and int8 with self-adaptive rescaling. The demo prints the
test accuracies, the arenas, and the share of shift reductions the adaptive run skipped.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch

import ubitrain as ub
from ubitrain.zoo import DigitsCNNNiti

from .data import BATCH, accuracy, epoch_batches, load_data, predict_padded, progress_bar

MU = (5, 4, 3)


def niti_config(total_steps: int, adaptive: bool, mu=MU) -> ub.NITI:
    """mu 5, 4, 3 over the thirds of training (NITI's schedule, shortened): each mu of `mu`
    for an equal share of the steps."""
    milestones = tuple(max(1, total_steps * (i + 1) // len(mu)) for i in range(len(mu) - 1))
    milestones = tuple(sorted(set(milestones)))
    return ub.NITI(mu=tuple(mu[:len(milestones) + 1]), milestones=milestones,
                   adaptive_rescale=adaptive)


def train_and_score(name, pkg, batches, x_train, y_train, x_test, y_test, progress,
                    log) -> dict:
    t = time.perf_counter()
    trainer = pkg.build()
    build = time.perf_counter() - t
    t = time.perf_counter()
    epochs = []
    try:
        for e, epoch in enumerate(batches, 1):
            losses = [trainer.step(x_train[idx], y_train[idx])
                      for idx in progress_bar(epoch, f"{name} epoch {e}/{len(batches)}", progress)]
            acc = accuracy(predict_padded(trainer.predict, x_test, BATCH), y_test)
            epochs.append({"loss": float(np.mean(losses)), "accuracy": acc})
            log(f"[{name:<13}] epoch {e}/{len(batches)}  loss {np.mean(losses):.4f}  "
                f"test accuracy {100 * acc:.2f}%")
        stats = trainer.rescale_stats() if hasattr(trainer, "rescale_stats") else None
    finally:
        getattr(trainer, "close", lambda: None)()
    return {"accuracy": epochs[-1]["accuracy"], "epochs": epochs, "rescale": stats,
            "arena_bytes": pkg.memory_plan.arena_bytes, "memory_plan": pkg.memory_plan.summary(),
            "build_seconds": build, "train_seconds": time.perf_counter() - t}


def run_int8_demo(epochs: int = 5, out_dir="build/demo_int8", seed: int = 0,
                  progress: bool = True, target: str = "host", log=print) -> dict:
    if epochs < 1:
        raise ub.UbitrainError(f"epochs={epochs}: train for at least one epoch")
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data(seed)
    batches = epoch_batches(len(x_train), BATCH, epochs, seed)
    total = sum(len(b) for b in batches)
    log(f"ubitrain demo --precision int8: NITI integer-only training of a CNN without BatchNorm "
        f"or biases on scikit-learn's digits, {len(x_train)} training / {len(x_test)} test "
        f"images, batch {BATCH}, {epochs} epoch(s), target {target}")
    torch.manual_seed(seed)
    model = DigitsCNNNiti()
    first = batches[0][0]
    x0, y0 = torch.from_numpy(x_train[first]), torch.from_numpy(y_train[first])
    out = Path(out_dir)
    runs = {}
    fp32 = ub.compile(copy.deepcopy(model), (x0,), y0,
                      optimizer=ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), target=target,
                      out_dir=out / "fp32")
    runs["fp32"] = train_and_score("fp32", fp32, batches, x_train, y_train, x_test, y_test,
                                   progress, log)
    for adaptive in (False, True):
        config = niti_config(total, adaptive)
        key = "int8_adaptive" if adaptive else "int8"
        pkg = ub.compile(copy.deepcopy(model), (x0,), y0, precision="int8", optimizer=config,
                         target=target, out_dir=out / key)
        runs[key] = train_and_score(key.replace("_", " "), pkg, batches, x_train, y_train, x_test,
                           y_test, progress, log)
        runs[key]["config"] = config
    f, i8, ad = runs["fp32"], runs["int8"], runs["int8_adaptive"]
    log(f"test accuracy: fp32 {100 * f['accuracy']:.2f}%, int8 {100 * i8['accuracy']:.2f}% "
        f"({100 * (i8['accuracy'] - f['accuracy']):+.2f} points), int8 with adaptive rescaling "
        f"{100 * ad['accuracy']:.2f}% ({100 * ad['rescale']['skipped_share']:.1f}% of "
        f"{ad['rescale']['reductions'] + ad['rescale']['skipped']:,} shift reductions skipped)")
    log(f"arena: fp32 {f['arena_bytes']:,} B, int8 {i8['arena_bytes']:,} B "
        f"({i8['arena_bytes'] / f['arena_bytes']:.2f}x) | mu {MU} at steps "
        f"{i8['config'].milestones} of {total} | demo {time.perf_counter() - start:.1f} s")
    return {"runs": runs, "fp32_accuracy": f["accuracy"], "int8_accuracy": i8["accuracy"],
            "int8_adaptive_accuracy": ad["accuracy"],
            "skipped_share": ad["rescale"]["skipped_share"],
            "fp32_arena_bytes": f["arena_bytes"], "int8_arena_bytes": i8["arena_bytes"],
            "steps": total, "total_seconds": time.perf_counter() - start}
