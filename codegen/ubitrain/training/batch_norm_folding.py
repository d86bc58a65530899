"""BatchNorm folded into the conv or linear layer before it, for precision="int8" with
NITI(batch_norm="fold") ("integer" trains NITI's integer BatchNorm with batch statistics
instead, niti/batch_norm.py; "auto", the default, chooses: `batch_norm_mode`).

As tiny-training does for its MCU models when it fine-tunes a trained net, each BatchNorm is
folded into the layer that feeds it, with its running statistics (what
`model.eval()` would compute): weight x gamma / sqrt(var + eps), bias (b - mean) x gamma /
sqrt(var + eps) + beta. The folded layer is then trained like any conv with a bias, and the
trained model has no BatchNorm. torch.fx's own `fuse` does the folding.
"""

from __future__ import annotations

import copy

from torch import nn
from torch.fx.experimental.optimization import fuse

from ..errors import UnsupportedOpError

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


def batch_norms(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, BATCH_NORMS)]


def batch_norm_mode(requested: str, model) -> str:
    """The BatchNorm mode NITI(batch_norm=`requested`) means for `model`. "auto" is
    "integer" when a BatchNorm still has PyTorch's initial statistics (no batch tracked, mean
    0, variance 1: a net trained from scratch, whose BatchNorms need batch statistics;
    folding would freeze them at the identity) and every BatchNorm has what an integer one
    needs (running statistics); "fold" otherwise, as for fine-tuning a
    trained net. Measured on the residual digits net from scratch (docs/int8.md): integer
    97.85%, folded 95.85%, fp32 98.37%."""
    if requested != "auto":
        return requested
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS)] \
        if isinstance(model, nn.Module) else []
    fresh = any(m.track_running_stats and int(m.num_batches_tracked) == 0
                and bool((m.running_mean == 0).all()) and bool((m.running_var == 1).all())
                for m in norms)
    integer = all(m.track_running_stats for m in norms)
    return "integer" if fresh and integer else "fold"


def weight_exponents_mode(requested: str, batch_norm: str, model) -> str:
    """The weight exponents NITI(weight_exponents=`requested`) means for `model` with its
    BatchNorms in mode `batch_norm`. "auto" is "channel" where BatchNorms are folded: folding
    multiplies each output channel by gamma / sigma, and one power of two per tensor cannot
    hold channels 363x apart (the 256 KB MobileNetV2: 15.5% instead of 90.5% on the classes
    it was trained on, docs/int8.md); "tensor" otherwise, where per channel measured the
    same within noise (digits nets from scratch: +0.30 and -0.07 points)."""
    if requested != "auto":
        return requested
    folded = batch_norm == "fold" and isinstance(model, nn.Module) and batch_norms(model)
    return "channel" if folded else "tensor"


def fold_batch_norms(model: nn.Module) -> nn.Module:
    """A copy of `model` with every BatchNorm folded into the conv or linear before it
    (the model itself when it has none). Refuses, naming it, a BatchNorm it cannot fold."""
    if not batch_norms(model):
        return model
    frozen = copy.deepcopy(model).eval()  # torch folds only in eval mode
    try:
        folded = fuse(frozen, inplace=True)
    except Exception as err:  # noqa: BLE001 - symbolic tracing fails in many ways
        raise UnsupportedOpError(
            f"precision='int8' folds each BatchNorm into the layer before it, which needs "
            f"torch.fx to trace the model: {type(err).__name__}: {err}") from None
    left = batch_norms(folded)
    if left:
        raise UnsupportedOpError(
            f"precision='int8': BatchNorm {', '.join(left)} does not directly follow a conv "
            "or linear layer whose only reader it is, so it cannot be folded into it. Put each "
            "BatchNorm right after its conv or linear, or train NITI's integer BatchNorm "
            "with batch statistics: optimizer=ub.NITI(batch_norm='integer')")
    old = dict(model.named_parameters())
    for name, p in folded.named_parameters():  # a bias that folding gave a bias-free layer
        if name not in old:  # torch leaves it frozen; it trains with its layer's weight
            owner = folded.get_submodule(name.rpartition(".")[0])
            p.requires_grad_(owner.weight.requires_grad)
    return folded.train(model.training)

