"""Which models micro-batching may split, and what it changes: the batch dimension of the
inputs, and the layers whose output or gradient depends on the other samples of the batch
(BatchNorm, a batch-mode StochasticDepth, embeddings scaled by frequency, ops that mix the
samples). Micro-batches of such a model train otherwise than the whole batch would."""

from __future__ import annotations

from ..errors import CompileError, warn


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def check_micro_batches(value, example_inputs, labels) -> int:
    """`micro_batches=` as an int k ≥ 1 that divides the batch of every input and the labels."""
    batch = int(example_inputs[0].shape[0]) if example_inputs[0].dim() else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CompileError(f"micro_batches={value!r} must be a whole number of micro-batches "
                           f">= 1 that divides the batch of {batch}; one of "
                           f"{divisors(batch) if batch else [1]}")
    if value == 1:
        return 1
    if not one_batch_dimension(example_inputs, labels):
        rows = [int(t.shape[0]) if t.dim() else None for t in list(example_inputs) + [labels]]
        raise CompileError(f"micro_batches={value} splits dimension 0 of every input and the "
                           f"labels, but their first dimensions are {rows}; give inputs and "
                           f"labels with the same batch first, or micro_batches=1")
    if batch % value:
        raise CompileError(f"micro_batches={value} does not divide the batch of {batch}; use "
                           f"one of {divisors(batch)}")
    return value


def frequency_scaled_embeddings(model) -> list[str]:
    """Embeddings that scale their gradient by each id's count in the whole batch, which a
    micro-batch cannot see (so micro-batching refuses them rather than train otherwise)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    return [name or "Embedding" for name, m in model.named_modules()
            if isinstance(m, torch.nn.Embedding) and m.scale_grad_by_freq]


def mixes_samples(model, example_inputs) -> bool:
    """Whether a sample's output depends on the other samples of its batch outside
    BatchNorm (`x.mean(0)`, `x[1:]`, `x.T @ x` over the batch): the model in evaluation mode,
    in float64, on a random batch shaped like the example, against the same batch in two
    parts. A model that does not run on the parts counts as mixing."""
    import copy

    import torch

    if len(example_inputs[0].shape) == 0 or example_inputs[0].shape[0] < 2:
        return False
    probe = copy.deepcopy(model).double().eval()
    gen = torch.Generator().manual_seed(0)
    batch = [torch.randn(x.shape, generator=gen, dtype=torch.float64)
             if x.is_floating_point() else x for x in example_inputs]
    try:
        with torch.no_grad():
            whole = probe(*batch)
            parts = torch.cat([probe(*[x[:1] for x in batch]), probe(*[x[1:] for x in batch])])
    except Exception:  # noqa: BLE001 - a model tied to its batch size: it cannot be split
        return True
    if not isinstance(whole, torch.Tensor) or whole.shape != parts.shape:
        return True
    return not torch.allclose(whole, parts, rtol=1e-9, atol=1e-12)


def _one_draw_per_batch(module) -> bool:
    """torchvision's StochasticDepth(mode="batch") drops the whole batch or none of it: a
    micro-batch draws its own (found by name: torchvision is not imported here)."""
    return type(module).__name__ == "StochasticDepth" and getattr(module, "mode", "") == "batch"


def batch_coupled_layers(model, tm, example_inputs=()) -> list[str]:
    """Layers whose training-mode output or gradient depends on the other samples of the
    batch."""
    import torch

    if isinstance(model, torch.nn.Module):
        norm = torch.nn.modules.batchnorm._BatchNorm
        # in eval mode, a BatchNorm with running statistics and a StochasticDepth see one
        # sample at a time
        names = [name or type(m).__name__ for name, m in model.named_modules()
                 if (isinstance(m, norm) and (m.training or m.running_mean is None))
                 or (_one_draw_per_batch(m) and m.training)]
        names += frequency_scaled_embeddings(model)
        if example_inputs and mixes_samples(model, example_inputs):
            names.append("ops that mix the samples of a batch")
    else:  # an ONNX ModelProto
        names = [n.name or n.op_type for n in getattr(getattr(model, "graph", None), "node", [])
                 if n.op_type == "BatchNormalization"]
    return names or [name for name in tm.buffer_updates]


def warn_batch_coupled(layers: list[str], k: int, batch: int) -> None:
    """Warn that micro-batches of batch / k samples change what `layers` (the
    batch_coupled_layers) compute."""
    if k <= 1 or not layers:
        return
    shown = ", ".join(layers[:4]) + (", ..." if len(layers) > 4 else "")
    warn(
        f"micro-batching: the step runs {k} micro-batches of {batch // k} samples, so the "
        f"parts of the model that couple samples ({shown}) see one micro-batch at a time, "
        f"not the batch of {batch} (BatchNorm normalises with the statistics of each "
        f"micro-batch and updates its running statistics {k} times per step); training "
        f"differs from full-batch training by more than float rounding. A memory_budget "
        f"that fits without micro-batching (or micro_batches=1) keeps the whole batch.")


def warn_integer_micro_batches(k: int, batch: int, norms: list[str]) -> None:
    """Warn what micro-batches of batch / k samples change in an int8 (NITI) step
    (niti/micro_batches.py): every tensor's exponent is a maximum over its batch, so every
    int8 model couples its samples; `norms`: its integer BatchNorms (batch statistics)."""
    if k <= 1:
        return
    shown = ", ".join(norms[:4]) + (", ..." if len(norms) > 4 else "")
    coupled = (f"; integer BatchNorm ({shown}) normalises with the statistics of each "
               f"micro-batch and updates its running statistics {k} times per step"
               if norms else "")
    warn(
        f"micro-batching: the int8 step runs {k} micro-batches of {batch // k} samples, so "
        f"NITI takes every exponent (the input's quantization, each activation's and error's "
        f"narrowing) from the maximum over one micro-batch, not the batch of {batch}, and "
        f"adds the micro-batches' int32 gradients at the coarsest of their exponents "
        f"(RoundShift) before its update{coupled}; predict quantizes each micro-batch's rows "
        f"on their own. Training differs from full-batch int8 training. A memory_budget that "
        f"fits without micro-batching (or micro_batches=1) keeps the whole batch.")


def one_batch_dimension(example_inputs, labels) -> bool:
    """Every input and the labels have the same batch as dimension 0 (what k > 1 splits)."""
    tensors = list(example_inputs) + [labels]
    return all(t.dim() and t.shape[0] == tensors[0].shape[0] for t in tensors)
