"""GRU and LSTM (and the Elman RNN): unrolled over time by PyTorch's own decompositions.

`nn.GRU` and `nn.LSTM` call one op each (`aten.gru.input`, `aten.lstm.input`,
`aten.rnn_tanh.input`, `aten.rnn_relu.input`). PyTorch registers a decomposition for each
(torch._decomp.decompositions: `gru_impl`, `lstm_impl`, ...), which ubitrain's export runs
(frontend/torch_export.py): it unrolls the layers over the (fixed) sequence into the
cell's ops: one `linear` of the whole input sequence per layer, then per time step a
`linear` of the hidden state, the gate chunks (`split`), sigmoid, tanh, mul and add.
ubitrain converts those like any other ops, so the backward pass is backprop through time by
the ordinary gradient rules.

What the decompositions leave out is refused (`refuse_lost_dropout`), where the module is
called (frontend/module_calls.py) and again, for a functional call, by the decomposition
itself:

- dropout between layers in training mode: `_rnn_helper` computes the dropout probability
  of a layer as `dropout if (train and num_layers < i - 1) else 0.0`, never true, so the
  decomposed graph would silently train without it, while PyTorch's own kernel draws masks
  from its generator inside the op where no one can replay them.

A bidirectional layer runs its reverse direction over the sequence flipped in time
(`aten.flip`); an LSTM with `proj_size` projects each hidden state by one more `linear`.
"""

from __future__ import annotations

import warnings

import torch
from torch._decomp import decomposition_table

from ..errors import UnsupportedOpError

aten = torch.ops.aten
RECURRENT_OPS = {aten.gru.input: "GRU", aten.lstm.input: "LSTM",
                 aten.rnn_tanh.input: "RNN", aten.rnn_relu.input: "RNN"}


def refuse_lost_dropout(where: str, name: str, num_layers: int, dropout: float,
                        train: bool) -> None:
    """Refuse what the decompositions would compute otherwise than PyTorch."""
    if train and dropout > 0 and num_layers > 1:
        raise UnsupportedOpError(
            f"{where}: {name}(dropout={dropout}) between its {num_layers} layers "
            "in training mode is not supported (PyTorch draws those masks inside its "
            f"kernel, where no one can replay them); use dropout=0, or stack one-layer "
            f"{name}s with nn.Dropout between them, which ubitrain supports")


def _guarded(op, decompose):
    def guarded_decomposition(*args, **kwargs):
        # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, ...)
        refuse_lost_dropout(f"a call of {op}", RECURRENT_OPS[op], *args[4:7])
        return decompose(*args, **kwargs)
    return guarded_decomposition


RECURRENT_DECOMPOSITIONS = {op: _guarded(op, decomposition_table[op]) for op in RECURRENT_OPS}


def ignore_recurrent_noise():
    """Inside `warnings.catch_warnings()`: silence what torch.export says about PyTorch's
    own RNN module (nn.RNNBase re-assigns `_flat_weights`, which export reports as a tensor
    attribute to register as a buffer), which is not about the user's model."""
    warnings.filterwarnings("ignore", r"The tensor attributes .*_flat_weights", UserWarning)
