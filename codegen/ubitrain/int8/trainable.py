"""Which weights an int8 step trains: a list of names, a SparseUpdate of whole layers, or
all; weights with requires_grad=False never."""

from __future__ import annotations

from ..errors import CompileError
from ..training.sparse_update import SparseUpdate
from .layers import LayerProgram


def freeze(program: LayerProgram, trainable, no_grad: frozenset = frozenset()) -> None:
    """Train only the weights `trainable` names (a list, one name, or a SparseUpdate of whole
    layers; None: all) that are not in `no_grad` (requires_grad=False, which PyTorch never
    updates); the others stay as they are and get no gradient."""
    names = list(program.weights)
    if trainable is None:
        chosen = names
    elif isinstance(trainable, SparseUpdate):
        if trainable.channels:
            raise CompileError("precision='int8' trains whole weights; SparseUpdate(channels="
                               "...) is fp32 only (use last_layers=k or a list of names)")
        chosen = trainable.select(names)
    else:
        chosen = [trainable] if isinstance(trainable, str) else list(trainable)
        named_frozen = [t for t in chosen if t in no_grad]
        if named_frozen:
            raise CompileError(f"trainable names {named_frozen}, which have requires_grad="
                               "False: PyTorch would not train them. Call requires_grad_(True) "
                               "on them or leave them out of trainable")
    chosen = [t for t in chosen if t not in no_grad]
    unknown = [t for t in chosen if t not in names]
    if unknown or not chosen:
        raise CompileError(f"trainable={trainable!r}: precision='int8' trains conv and linear "
                           f"weights; name at least one of: {', '.join(names)}"
                           + (f" ({unknown} are not among them)" if unknown else ""))
    for layer in program.convs():
        layer.trainable = layer.weight in chosen
    program.number_sites()
