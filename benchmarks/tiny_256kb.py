"""The 256 KB line: a MobileNetV2 (width 0.35) fine-tuned in int8 with a sparse update, at
batch 1, on the emulated Cortex-M7 board, beside the same net and update in fp32 on the host.

    python benchmarks/tiny_256kb.py [--size 32] [--steps 600] [--out results/tiny_256kb.json]

The setting of on-device transfer learning: torchvision's mobilenet_v2(width_mult=0.35) with a
one-channel stem and no Dropout is pre-trained in PyTorch (fp32) on scikit-learn's digits 0-4,
upscaled to size x size; the board then learns the digits 5-9 from its own samples, one at a
time, through the generated C (precision="int8", NITI), training every bias and the
classifier (`SparseUpdate(biases=True, last_layers=1)`); frozen weights stay in flash. The
fp32 row is the same net (BatchNorm folded as int8 folds it), the same sparse update, SGD at
batch 1, on the host through the generated C.

Reported: the board build's SRAM (.data + .bss, which hold the arena and the batch buffers,
plus the stack the linker reserves) and flash from the ELF (arm-none-eabi-size), the arena
against a full update's, accuracy on the digits 5-9 before and after, and every activation
the step keeps from the forward pass for the backward, with the backward kernels that read
it: why it is kept. Before fine-tuning, the pre-trained net's accuracy on the digits 0-4 in
fp32, with its weights rounded to int8 at one power-of-two scale per tensor (NITI's) and per
output channel (in PyTorch), and through the int8 C's predict: what int8 starts from.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import _results  # noqa: F401 - the repository's root on sys.path
import numpy as np
import torch
from _results import write_json

import ubitrain as ub
from tools.real_models import torchvision_models
from ubitrain.demos.data import accuracy, epoch_batches, load_data
from ubitrain.training.batch_norm_folding import fold_batch_norms

RULE = ub.SparseUpdate(biases=True, last_layers=1)
LIMIT = 256 * 1024


def mobilenet_v2(classes: int = 10) -> torch.nn.Module:
    model = torchvision_models().mobilenet_v2(width_mult=0.35, num_classes=classes)
    stem = model.features[0][0]
    model.features[0][0] = torch.nn.Conv2d(1, stem.out_channels, 3, 2, 1, bias=False)
    model.classifier[0] = torch.nn.Identity()  # no Dropout: NITI has no random masks
    return model


def upscaled(x: np.ndarray, size: int) -> np.ndarray:
    return torch.nn.functional.interpolate(torch.from_numpy(x), size=(size, size),
                                           mode="bilinear", align_corners=False).numpy()


def pretrain(model, x, y, epochs: int, seed: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    model.train()
    for epoch in epoch_batches(len(x), 32, epochs, seed):
        for idx in epoch:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x[idx])),
                                              torch.from_numpy(y[idx])).backward()
            opt.step()


def kept_activations(program) -> list[dict]:
    """Transient buffers written before the loss and read after it (before anything after
    the loss writes over them), with the backward kernels that read them."""
    calls = program.calls
    loss = next(i for i, c in enumerate(calls) if "xent" in c.kernel)
    written, out, overwritten = {}, {}, set()
    for i, call in enumerate(calls):
        for k, slot in enumerate(call.args):
            root = slot.root
            if root.kind not in ("activation", "mask"):
                continue
            if i < loss and k in call.outputs:
                written.setdefault(root.name, (root, call.kernel))
            elif i > loss and root.name in written and root.name not in overwritten \
                    and k not in call.outputs:
                entry = out.setdefault(root.name, {
                    "name": root.name, "bytes": root.nbytes, "dtype": root.dtype,
                    "written_by": written[root.name][1], "read_by": []})
                if call.kernel not in entry["read_by"]:
                    entry["read_by"].append(call.kernel)
        if i > loss:
            overwritten |= {call.args[k].root.name for k in call.outputs}
    return sorted(out.values(), key=lambda e: -e["bytes"])


def power_of_two_weights(model, per_channel: bool):
    """A copy of `model` with each conv and linear weight rounded to int8 at a power-of-two
    scale: one per tensor, or one per output channel."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        if p.dim() > 1:
            top = p.detach().abs().flatten(1).amax(1) if per_channel else p.detach().abs().max()
            scale = 2.0 ** torch.ceil(torch.log2(top.clamp_min(1e-30) / 127))
            scale = scale.view(-1, *[1] * (p.dim() - 1)) if per_channel else scale
            p.data = torch.clamp(torch.round(p.data / scale), -127, 127) * scale
    return model


def evaluate(predict, x, y) -> float:
    return accuracy(np.concatenate([predict(x[i:i + 1]) for i in range(len(x))]), y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32, help="input side, digits upscaled")
    p.add_argument("--steps", type=int, default=600, help="fine-tuning steps at batch 1")
    p.add_argument("--pretrain-epochs", type=int, default=6)
    p.add_argument("--test", type=int, default=200, help="test images of digits 5-9")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-exponents", choices=["channel", "tensor"], default="channel",
                   help="int8 weights' exponents: per output channel (folding spreads channel "
                        "scales) or one per tensor")
    p.add_argument("--out", type=Path, default=Path("results/tiny_256kb.json"))
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    x_train, x_test = upscaled(x_train, args.size), upscaled(x_test, args.size)
    old, new, new_test = y_train < 5, y_train >= 5, y_test >= 5
    model = mobilenet_v2()
    pretrain(model, x_train[old], y_train[old], args.pretrain_epochs, args.seed)
    model = fold_batch_norms(model.eval())  # what int8 trains; fp32 trains it too
    x_new, y_new = x_train[new], y_train[new]
    x_eval, y_eval = x_test[new_test][:args.test], y_test[new_test][:args.test]
    x_old, y_old = x_test[~new_test][:args.test], y_test[~new_test][:args.test]

    def torch_predict(net):
        return lambda xs: net(torch.from_numpy(xs)).detach().numpy()
    old_classes = {name: evaluate(torch_predict(net), x_old, y_old) for name, net in (
        ("fp32", model), ("int8_weights_per_tensor", power_of_two_weights(model, False)),
        ("int8_weights_per_channel", power_of_two_weights(model, True)))}
    order = np.random.default_rng(args.seed).integers(0, len(x_new), args.steps)
    example, label = torch.from_numpy(x_new[:1]), torch.from_numpy(y_new[:1])
    results = {"size": args.size, "steps": args.steps, "rule": "biases + last layer",
               "weight_exponents": args.weight_exponents}

    with tempfile.TemporaryDirectory(prefix="ub_256kb_") as tmp:
        int8 = ub.compile(copy.deepcopy(model), (example,), label, precision="int8",
                          target="cortex-m7", trainable=RULE, out_dir=Path(tmp) / "int8",
                          optimizer=ub.NITI(mu=(4, 3), milestones=(args.steps // 2,),
                                            weight_exponents=args.weight_exponents))
        full = ub.compile(copy.deepcopy(model), (example,), label, precision="int8",
                          target="cortex-m7", out_dir=Path(tmp) / "full")
        fp32 = ub.compile(copy.deepcopy(model), (example,), label, trainable=RULE,
                          optimizer=ub.SGD(lr=0.01), out_dir=Path(tmp) / "fp32")
        kept = kept_activations(int8.programs["train_step"])
        host = fp32.build()
        with int8.build() as board:
            memory = board.device_memory
            before = evaluate(host.predict, x_eval, y_eval)
            old_classes["int8_c"] = evaluate(board.predict, x_old, y_old)
            for i in order:
                board.step(x_new[i:i + 1], y_new[i:i + 1])
                host.step(x_new[i:i + 1], y_new[i:i + 1])
            after_int8 = evaluate(board.predict, x_eval, y_eval)
            after_fp32 = evaluate(host.predict, x_eval, y_eval)
    results.update(
        sram_bytes=memory["sram_bytes"], flash_bytes=memory["flash_bytes"],
        sram_within_256kb=memory["sram_bytes"] <= LIMIT, board=memory["summary"],
        arena_bytes=int8.memory_plan.arena_bytes,
        full_update_arena_bytes=full.memory_plan.arena_bytes,
        trainable=len(int8.trainable), frozen_in_flash=len(int8.frozen_in_flash),
        accuracy_before=before, accuracy_int8=after_int8, accuracy_fp32=after_fp32,
        old_classes_before=old_classes,
        kept_activations=kept)
    print(memory["summary"])
    print(f"SRAM {memory['sram_bytes']:,} B of the 256 KB line ({LIMIT:,} B): "
          f"{'within' if results['sram_within_256kb'] else 'OVER'}; arena "
          f"{results['arena_bytes']:,} B (full update: {results['full_update_arena_bytes']:,} B,"
          f" {results['full_update_arena_bytes'] / results['arena_bytes']:.1f}x)")
    print(f"digits 0-4 before fine-tuning ({len(y_old)} test images): " + ", ".join(
        f"{k.replace('_', ' ')} {v:.1%}" for k, v in old_classes.items()))
    print(f"digits 5-9 ({len(y_eval)} test images): {before:.1%} before; after {args.steps} "
          f"steps: int8 on the board {after_int8:.1%}, fp32 on the host {after_fp32:.1%}")
    print(f"activations kept for the backward ({sum(k['bytes'] for k in kept):,} B):")
    for k in kept:
        print(f"  {k['name']}: {k['bytes']:,} B {k['dtype']}, from {k['written_by']}, "
              f"read by {', '.join(k['read_by'])}")
    write_json(args.out, results)


if __name__ == "__main__":
    main()
