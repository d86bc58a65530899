"""nn.GRU, nn.LSTM and nn.RNN train through the generated C as in PyTorch: each configuration
over 3 steps, judged against PyTorch in float64 (harness.assert_trains_like_torch: every parameter's
change and optimizer state per step, so every gradient of backprop through time, and the
eval-mode output). Short odd sequences keep it fast; the 49-step keyword-spotting nets are
tests/test_real_models.py's."""

from __future__ import annotations

import pytest
import torch
from harness import assert_trains_like_torch
from torch import nn

import ubitrain as ub
from ubitrain.errors import UnsupportedOpError

CLASSES, FEATURES, HIDDEN = 3, 3, 5


class Recurrent(nn.Module):
    """`rnn` then a Linear head over what `read` names: "seq" the output sequence, "final"
    the final hidden state (and cell state, LSTM), "both". `h0`: None (zeros), "input" (the
    initial state(s) as model inputs after x) or "learned" (a trained parameter, so its
    gradient is that of the first step)."""

    def __init__(self, rnn: nn.RNNBase, steps: int, read: str = "seq", h0=None):
        super().__init__()
        self.rnn, self.read, self.h0 = rnn, read, h0
        lstm = isinstance(rnn, nn.LSTM)
        directions = 2 if rnn.bidirectional else 1
        out = rnn.proj_size or rnn.hidden_size
        self.state_shapes = [(rnn.num_layers * directions, out)]
        if lstm:
            self.state_shapes.append((rnn.num_layers * directions, rnn.hidden_size))
        if h0 == "learned":
            self.initial = nn.ParameterList(nn.Parameter(torch.randn(n, 1, h) * 0.5)
                                            for n, h in self.state_shapes)
        width = {"seq": steps * directions * out,
                 "final": sum(n * h for n, h in self.state_shapes)}
        width["both"] = width["seq"] + width["final"]
        self.head = nn.Linear(width[read], CLASSES)

    def forward(self, x, *given):
        batch = x.shape[0] if self.rnn.batch_first else x.shape[1]
        if self.h0 == "learned":  # the parameters broadcast over the batch
            given = [p + torch.zeros(n, batch, h) for p, (n, h) in
                     zip(self.initial, self.state_shapes)]
        state = None if not given else given[0] if len(given) == 1 else tuple(given)
        seq, final = self.rnn(x, state)
        finals = final if isinstance(final, tuple) else (final,)
        if not self.rnn.batch_first:
            seq = seq.transpose(0, 1)
        parts = {"seq": [seq.flatten(1)],
                 "final": [f.transpose(0, 1).flatten(1) for f in finals]}
        parts["both"] = parts["seq"] + parts["final"]
        return self.head(torch.cat(parts[self.read], 1))


def _batches(model: Recurrent, batch: int, steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x_shape = (batch, steps, FEATURES) if model.rnn.batch_first else (steps, batch, FEATURES)

    def sample():
        xs = [torch.randn(x_shape, generator=gen)]
        if model.h0 == "input":
            xs += [torch.randn(n, batch, h, generator=gen) for n, h in model.state_shapes]
        return (*xs, torch.randint(0, CLASSES, (batch,), generator=gen))
    return [sample() for _ in range(3)]


def _judge(cls, rnn_kw, tmp_path, batch=2, steps=5, read="seq", h0=None, optimizer=None):
    torch.manual_seed(0)
    model = Recurrent(cls(FEATURES, HIDDEN, **rnn_kw), steps, read, h0)
    optimizer = optimizer or ub.SGD(lr=0.1, momentum=0.9)
    assert_trains_like_torch(model, _batches(model, batch, steps), optimizer, tmp_path)


# (rnn keyword arguments, batch, steps, read, h0, optimizer)
CASES = {
    "one_layer": (dict(batch_first=True), 1, 5, "seq", None, "sgd"),
    "one_layer_time_major": (dict(), 3, 5, "final", None, "adam"),
    "two_layers_no_bias": (dict(num_layers=2, bias=False, batch_first=True), 2, 3, "both",
                           None, "adam"),
    "three_layers_given_state": (dict(num_layers=3), 2, 3, "final", "input", "sgd"),
    "learned_state": (dict(num_layers=2, batch_first=True), 1, 3, "seq", "learned", "adam"),
    "bidirectional": (dict(num_layers=2, bidirectional=True, batch_first=True), 2, 3, "both",
                      None, "sgd"),
}
OPTIMIZERS = {"sgd": lambda: ub.SGD(lr=0.1, momentum=0.9), "adam": lambda: ub.Adam(lr=0.01)}


@pytest.mark.parametrize("cls", [nn.GRU, nn.LSTM], ids=["gru", "lstm"])
@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_trains_like_pytorch(cls, case, tmp_path):
    rnn_kw, batch, steps, read, h0, optimizer = CASES[case]
    _judge(cls, rnn_kw, tmp_path, batch, steps, read, h0, OPTIMIZERS[optimizer]())


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("read", ["seq", "final"])
def test_lstm_projection(read, tmp_path):
    _judge(nn.LSTM, dict(proj_size=2, num_layers=2, batch_first=True), tmp_path, read=read,
           h0="learned", optimizer=ub.Adam(lr=0.01))


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_elman_rnn(nonlinearity, tmp_path):
    _judge(nn.RNN, dict(nonlinearity=nonlinearity, num_layers=2), tmp_path, read="both")


def test_dropout_between_layers_only_in_training_is_refused(tmp_path):
    """PyTorch draws the masks between layers inside its kernel: no one can replay them."""
    model = Recurrent(nn.LSTM(FEATURES, HIDDEN, num_layers=2, dropout=0.2), 3)
    x, y = torch.randn(3, 2, FEATURES), torch.randint(0, CLASSES, (2,))
    with pytest.raises(UnsupportedOpError, match=r"rnn: LSTM\(dropout=0.2\) between its 2 "
                                                 r"layers.*use dropout=0.*nn.Dropout"):
        ub.compile(model, (x,), y, optimizer=ub.SGD(lr=0.1), out_dir=tmp_path)


class FunctionalGRU(nn.Module):
    """torch.gru called without nn.GRU: only the op's own arguments say it has dropout."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(FEATURES, HIDDEN, num_layers=2)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        h0 = torch.zeros(2, x.shape[1], HIDDEN)
        seq, _ = torch.gru(x, h0, self.gru._flat_weights, True, 2, 0.25, self.training,
                           False, False)
        return self.head(seq[-1])


def test_dropout_between_layers_of_a_functional_call_is_refused(tmp_path):
    x, y = torch.randn(3, 2, FEATURES), torch.randint(0, CLASSES, (2,))
    with pytest.raises(UnsupportedOpError, match=r"a call of aten.gru.input: GRU\(dropout=0.25\) "
                                                 r"between its 2 layers"):
        ub.compile(FunctionalGRU(), (x,), y, optimizer=ub.SGD(lr=0.1), out_dir=tmp_path)


@pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last")
def test_dropout_of_one_layer_is_no_dropout(tmp_path):
    """With one layer PyTorch applies no dropout at all (there is no layer after it)."""
    _judge(nn.GRU, dict(dropout=0.3), tmp_path, steps=3)
