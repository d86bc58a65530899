"""Hugging Face transformers as a new user tries them (tools/hf_models.py: tiny random
configurations, no download) train through the generated C as in PyTorch: 3 steps of SGD
with cross-entropy (GPT-2's and Llama's over the next token at every position: the causal
LM loss), each judged against PyTorch in float64 (ubitrain.fidelity.referee). Their masks
and position ids are built from shapes and int64 buffers, computed at compile time
(frontend/constants.py); Llama's rotary sines and cosines, from the float buffer
`inv_freq`, in the step; `bert_padded`'s `attention_mask`, a model input that pads each
sample to its own length and varies per batch, in the step too."""

import pytest
import torch
from harness import assert_trains_like_torch

import ubitrain as ub

pytest.importorskip("transformers")
from tools.hf_models import HF_MODELS, hf_batches  # noqa: E402

MODELS = ["bert", "bert_padded", "distilbert", "vit", "whisper_encoder", "wav2vec2", "gpt2",
          "llama"]
CASES = [(name, batch) for name in MODELS for batch in (1, 4)]


@pytest.mark.parametrize("name,batch", CASES, ids=[f"{n}-b{b}" for n, b in CASES])
def test_hf_model_trains_like_pytorch(name, batch, tmp_path):
    torch.set_num_threads(1)
    model = HF_MODELS[name]
    torch.manual_seed(0)
    assert_trains_like_torch(model.make(), hf_batches(model, batch), ub.SGD(lr=0.1, momentum=0.9),
                             tmp_path)
