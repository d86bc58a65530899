"""Refusals that need a module call's own arguments, which the exported ATen graph no longer
names: hooks on the modules check every call while torch.export traces the model.

`nn.MultiheadAttention` decomposes into linear, bmm/matmul, softmax and layout ops, or into
scaled_dot_product_attention (need_weights=False), which all train as in PyTorch. Its
key_padding_mask would become a runtime mask, and its dropout with need_weights=False a
dropout inside scaled_dot_product_attention; neither has a lowering, and the ATen ops they
leave behind (masked_fill of an input, SDPA's dropout_p) would not say which argument did it.

A recurrent module's dropout between layers is refused here too, by the module's name
(frontend/recurrent.py says why).
"""

from __future__ import annotations

import contextlib
import inspect

from torch import nn

from ..errors import UnsupportedOpError
from .recurrent import refuse_lost_dropout

_MHA_WORKS = ("nn.MultiheadAttention works with query, key and value tensors, "
              "need_weights True or False, a constant attn_mask (a plain tensor attribute, "
              "not an input or buffer) and dropout with need_weights=True")


def _check_attention(name, module, args, kwargs):
    call = inspect.signature(module.forward).bind(*args, **kwargs)
    call.apply_defaults()
    given = call.arguments
    where = f"{name or '<top>'} (nn.MultiheadAttention)"
    if given["key_padding_mask"] is not None:
        raise UnsupportedOpError(
            f"{where}: key_padding_mask is not supported (a mask that changes with the "
            f"input); {_MHA_WORKS}. Pad to a fixed length without a mask, or pass a "
            f"constant attn_mask")
    if module.training and module.dropout > 0 and not given["need_weights"]:
        raise UnsupportedOpError(
            f"{where}: dropout={module.dropout} with need_weights=False is not supported "
            f"(its dropout is inside scaled_dot_product_attention); call it with "
            f"need_weights=True, where the dropout is a Dropout on the attention weights "
            f"with the C runtime's masks, or use dropout=0")


@contextlib.contextmanager
def checked_calls(model: nn.Module):
    """While active, every call of a checked submodule of `model` is checked."""
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            def hook(mod, args, kwargs, name=name):
                _check_attention(name, mod, args, kwargs)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        elif isinstance(module, nn.RNNBase):
            def hook(mod, args, name=name):
                refuse_lost_dropout(name or "<top>", type(mod).__name__, mod.num_layers,
                                    mod.dropout, mod.training)
            handles.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
