"""nn.Embedding with integer model inputs, through the generated C, against PyTorch.

The op harness (tests/op_harness.py) shifts every input by a zero parameter, which an id
tensor cannot take, so these tests read the gradient from one SGD(lr=1) step instead, judged
by the fidelity referee: the table moves by exactly -grad. The ids repeat (their gradients
sum) and hold the padding index (whose row gets no gradient).
"""

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch, require_tools
from torch import nn

import ubitrain as ub

VOCAB, DIM, CLASSES, TOKENS = 20, 6, 3, 5
# repeated ids (2, 7, 19), the padding id 0, and both ends of the table
IDS = torch.tensor([[2, 2, 0, 7, 19], [0, 0, 7, 2, 1], [19, 3, 3, 3, 0], [5, 7, 2, 0, 0]])
LABELS = torch.tensor([0, 2, 1, 2])


class Classifier(nn.Module):
    """Embedding, mean over the tokens, linear: the smallest text classifier; `positions`
    adds a learned position embedding indexed by a constant (torch.arange)."""

    def __init__(self, positions: bool = False, scale_grad_by_freq: bool = False):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM, padding_idx=0, scale_grad_by_freq=scale_grad_by_freq)
        self.pos = nn.Embedding(TOKENS, DIM) if positions else None
        self.fc = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        h = self.tok(ids)
        if self.pos is not None:
            h = h + self.pos(torch.arange(ids.shape[1]))
        return self.fc(h.mean(dim=1))


def _model(positions=False, scale_grad_by_freq=False) -> Classifier:
    torch.manual_seed(0)
    model = Classifier(positions, scale_grad_by_freq)
    with torch.no_grad():  # a nonzero padding row: PyTorch still gives it no gradient
        model.tok.weight[0] = torch.linspace(-1, 1, DIM)
    return model


@pytest.fixture(scope="module")
def sgd_trainer(tmp_path_factory):
    model = _model()
    pkg = ub.compile(model, (IDS,), LABELS, optimizer=ub.SGD(lr=1.0),
                     out_dir=tmp_path_factory.mktemp("emb_sgd") / "emb")
    return model, pkg.build()


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_forward_and_gradient_match_pytorch(scale_grad_by_freq, tmp_path):
    """One step of SGD(lr=1): the table moves by exactly -grad, which the referee checks
    (and the loss, and predict's output after the step); with scale_grad_by_freq each id's
    gradient is divided by its count in the batch."""
    model = _model(scale_grad_by_freq=scale_grad_by_freq)
    judged = assert_trains_like_torch(model, [(IDS, LABELS)], ub.SGD(lr=1.0), tmp_path)
    before, after = model.tok.weight.detach().numpy(), judged.parameters["tok.weight"]
    assert np.array_equal(before[0], after[0])  # the padding row
    unused = [i for i in range(VOCAB) if i not in IDS]
    assert np.array_equal(before[unused], after[unused])


def test_ids_are_checked(sgd_trainer):
    model, trainer = sgd_trainer
    before = trainer.parameters()
    for bad in (VOCAB, -1):
        ids = IDS.clone()
        ids[1, 3] = bad
        with pytest.raises(IndexError):  # PyTorch's own refusal of these ids
            model(ids)
        with pytest.raises(ub.InputError, match=r"embedding ids .* \[0, 20\)"):
            trainer.step(ids, LABELS)
        with pytest.raises(ub.InputError, match=r"embedding ids .* \[0, 20\)"):
            trainer.predict(ids)
        # the C refuses them itself (the fast path hands a ready batch straight to it)
        status, _ = trainer._train_step([ids.numpy()], LABELS.numpy())
        assert status == -14
        status, _ = trainer._predict([ids.numpy()])
        assert status == -14
    with pytest.raises(ub.InputError, match="must be an integer array"):
        trainer.step(IDS.float(), LABELS)
    with pytest.raises(ub.InputError, match="must be an integer array"):
        trainer.predict(IDS.float())
    after = trainer.parameters()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    # int32 ids are the same ids
    assert np.array_equal(trainer.predict(IDS.int()), trainer.predict(IDS))


def test_embedding_on_cortex_m4(tmp_path):
    """The int64 ids cross to the emulated board, which checks them itself too."""
    require_tools("cortex-m4")
    judged = assert_trains_like_torch(_model(), [(IDS, LABELS)], ub.SGD(lr=1.0), tmp_path,
                                      target="cortex-m4")
    bad = IDS.clone()
    bad[2, 1] = VOCAB
    with judged.trainer as trainer:
        assert trainer._train_step([bad.numpy()], LABELS.numpy())[0] == -14


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_text_classifier_trains_like_pytorch(optimizer, tmp_path):
    optimizer = {"sgd_momentum": ub.SGD(lr=0.5, momentum=0.9, weight_decay=1e-3),
                 "adam": ub.Adam(lr=0.05)}[optimizer]
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, IDS.shape, generator=gen),
                torch.randint(0, CLASSES, LABELS.shape, generator=gen)) for _ in range(3)]
    batches[0] = (IDS, LABELS)  # repeated and padding ids
    assert_trains_like_torch(_model(positions=True), batches, optimizer, tmp_path)


class _Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.emb, self.fn = nn.Embedding(VOCAB, DIM), fn

    def forward(self, ids):
        return self.fn(self, ids).mean(dim=1)


@pytest.mark.parametrize("fn, match", [
    (lambda m, ids: nn.functional.embedding(ids, m.emb.weight, sparse=True), "sparse"),
    (lambda m, ids: m.emb(ids + 1), "ids computed inside the model"),
    (lambda m, ids: m.emb(ids) + m.emb(torch.arange(VOCAB - 2, VOCAB + 3)),
     "constant embedding ids"),
])
def test_unsupported_embeddings_are_refused(fn, match, tmp_path):
    with pytest.raises(ub.UnsupportedOpError, match=match):
        ub.compile(_Wrap(fn), (IDS,), LABELS, out_dir=tmp_path / "m")


def test_frequency_scaling_is_refused_with_micro_batches(tmp_path):
    """The counts are of the whole batch; a micro-batch would count only its own ids."""
    with pytest.raises(ub.CompileError, match="scale_grad_by_freq"):
        ub.compile(_model(scale_grad_by_freq=True), (IDS,), LABELS, micro_batches=2,
                   out_dir=tmp_path / "m")
