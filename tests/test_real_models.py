"""Models nobody here wrote train through the generated C as in PyTorch: 3 steps, each judged
against PyTorch in float64 (ubitrain.fidelity.referee). The part that fits CI time; the
whole table (torchvision's classifiers at batch 1, 4 and 8) is benchmarks/fidelity.py's."""

import pytest
import torch

import ubitrain as ub
from tools.real_models import batches, real_model
from ubitrain.fidelity.referee import judge

# (model, batch, one sample's shape: None for the model's own; smaller keeps CI short)
CASES = [("lenet5", 1, None), ("lenet5", 8, None), ("ds_cnn_kws", 4, None),
         ("mobilenet_v2", 2, (3, 48, 48)), ("vit_tiny", 2, None), ("har_cnn", 1, None),
         ("har_cnn", 8, None), ("fasttext_bag", 1, None), ("fasttext_bag", 8, None),
         # 13 of the 49 MFCC frames: the same ops, a quarter of the time steps to unroll
         ("gru_kws", 8, (13, 10)), ("basic_lstm_kws", 1, (13, 10))]


@pytest.mark.parametrize("name,batch,sample", CASES, ids=[f"{n}-b{b}" for n, b, _ in CASES])
def test_real_model_trains_like_pytorch(name, batch, sample, tmp_path):
    torch.set_num_threads(1)
    model = real_model(name)
    torch.manual_seed(0)
    verdict = judge(model.make(), batches(model, batch, sample=sample),
                    ub.SGD(**model.optimizer), tmp_path)
    assert verdict.status == "match", verdict.summary()
