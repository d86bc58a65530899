"""The ubitrain demo: a small CNN learns scikit-learn's handwritten digits through generated C.

The same network, with the same initial weights, the same batches in the same order and the
same optimizer, is trained twice: once by the C training step that `ub.compile` writes (built
with CMake and loaded with ctypes), once by PyTorch on one thread. The demo prints both test
accuracies, the compile time and the memory plan, and returns them as a dict.

    ubitrain demo --epochs 5
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import ubitrain as ub
from ubitrain.zoo import DigitsCNN

from .data import BATCH, accuracy, epoch_batches, load_data, predict_padded, progress_bar


def run_demo(epochs: int = 5, out_dir="build/demo", lr: float = 0.05, momentum: float = 0.9,
             weight_decay: float = 1e-4, seed: int = 0, progress: bool = True, target="host",
             log=print) -> dict:
    """Train the digits CNN through the generated C and in PyTorch; return the figures.

    Keys of the result: c_accuracy, torch_accuracy (test accuracy after the last epoch, in
    [0, 1]), c_epochs / torch_epochs (per epoch: mean training loss and test accuracy),
    compile_seconds, build_seconds, c_train_seconds, torch_train_seconds, total_seconds,
    memory_plan (the one-line summary), arena_bytes, lower_bound_bytes, kernels,
    max_param_diff (largest absolute difference of any parameter or buffer at the end),
    out_dir, train_samples, test_samples."""
    if epochs < 1:
        raise ub.UbitrainError(f"epochs={epochs}: train for at least one epoch")
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data(seed)
    batches = epoch_batches(len(x_train), BATCH, epochs, seed)
    log(f"ubitrain demo: a CNN on scikit-learn's digits, {len(x_train)} training and "
        f"{len(x_test)} test images (8x8), batch {BATCH}, {epochs} epoch(s), "
        f"SGD(lr={lr}, momentum={momentum}, weight_decay={weight_decay})")

    torch.manual_seed(seed)
    model = DigitsCNN()
    reference = copy.deepcopy(model)  # PyTorch's copy: the very same initial weights

    first = batches[0][0]
    pkg = ub.compile(model, (torch.from_numpy(x_train[first]),), torch.from_numpy(y_train[first]),
                     loss="cross_entropy",
                     optimizer=ub.SGD(lr=lr, momentum=momentum, weight_decay=weight_decay),
                     target=target, out_dir=out_dir, progress=None if progress else False)
    t = time.perf_counter()
    trainer = pkg.build(seed=seed, progress=None if progress else False)
    build_seconds = time.perf_counter() - t
    if target != "host":  # the steps below run on the emulated device, one QEMU process
        log(f"target {target}: cross-compiled; training runs under "
            f"{' '.join(trainer.command[:3])} ...")
        if trainer.device_memory:
            log(f"device memory: {trainer.device_memory['summary']}")
    log(f"compiled in {pkg.compile_seconds:.1f} s ({pkg.kernel_count} C kernels), built with "
        f"CMake in {build_seconds:.1f} s: {Path(out_dir)}")

    # -- the generated C ----------------------------------------------------------------------
    c_epochs = []
    t = time.perf_counter()
    for e, epoch in enumerate(batches, 1):
        losses = [trainer.step(x_train[idx], y_train[idx])
                  for idx in progress_bar(epoch, f"C epoch {e}/{epochs}", progress)]
        acc = accuracy(predict_padded(trainer.predict, x_test, BATCH), y_test)
        c_epochs.append({"loss": float(np.mean(losses)), "accuracy": acc})
        log(f"[generated C] epoch {e}/{epochs}  loss {np.mean(losses):.4f}  "
            f"test accuracy {100 * acc:.2f}%")
    c_train_seconds = time.perf_counter() - t

    # -- PyTorch, the same batches from the same weights ---------------------------------------
    torch_epochs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=momentum,
                              weight_decay=weight_decay)
        loss_fn = nn.CrossEntropyLoss()
        xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)

        def torch_predict(chunk):
            with torch.no_grad():
                return reference(torch.from_numpy(chunk)).numpy()

        t = time.perf_counter()
        for e, epoch in enumerate(batches, 1):
            reference.train()
            losses = []
            for idx in progress_bar(epoch, f"PyTorch epoch {e}/{epochs}", progress):
                opt.zero_grad()
                loss = loss_fn(reference(xt[idx]), yt[idx])
                loss.backward()
                opt.step()
                losses.append(loss.item())
            reference.eval()
            acc = accuracy(predict_padded(torch_predict, x_test, BATCH), y_test)
            torch_epochs.append({"loss": float(np.mean(losses)), "accuracy": acc})
            log(f"[PyTorch]     epoch {e}/{epochs}  loss {np.mean(losses):.4f}  "
                f"test accuracy {100 * acc:.2f}%")
        torch_train_seconds = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)

    c_params = trainer.parameters()
    getattr(trainer, "close", lambda: None)()  # ends the emulator of a cross target
    max_diff = max(float(np.max(np.abs(c_params[k] - v.detach().numpy().astype(c_params[k].dtype))))
                   for k, v in reference.state_dict().items() if k in c_params)
    result = {
        "c_accuracy": c_epochs[-1]["accuracy"],
        "torch_accuracy": torch_epochs[-1]["accuracy"],
        "c_epochs": c_epochs,
        "torch_epochs": torch_epochs,
        "compile_seconds": pkg.compile_seconds,
        "build_seconds": build_seconds,
        "c_train_seconds": c_train_seconds,
        "torch_train_seconds": torch_train_seconds,
        "memory_plan": pkg.memory_plan.summary(),
        "arena_bytes": pkg.memory_plan.arena_bytes,
        "lower_bound_bytes": pkg.memory_plan.lower_bound_bytes,
        "kernels": pkg.kernel_count,
        "max_param_diff": max_diff,
        "out_dir": str(out_dir),
        "target": target,
        "device_memory": getattr(trainer, "device_memory", {}),
        "train_samples": len(x_train),
        "test_samples": len(x_test),
    }
    result["total_seconds"] = time.perf_counter() - start
    log(f"test accuracy: generated C {100 * result['c_accuracy']:.2f}%, PyTorch "
        f"{100 * result['torch_accuracy']:.2f}% | compile {pkg.compile_seconds:.1f} s | "
        f"memory plan: {result['memory_plan']}")
    steps = sum(len(epoch) for epoch in batches)
    log(f"training time: C {c_train_seconds:.1f} s, PyTorch (1 thread) "
        f"{torch_train_seconds:.1f} s; largest parameter difference after {steps} steps "
        f"{max_diff:.1e} (float rounding differences compound step by step); "
        f"demo total {result['total_seconds']:.1f} s")
    return result


if __name__ == "__main__":
    run_demo()
