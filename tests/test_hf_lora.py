"""LoRA as people fine-tune today: tools/hf_models.py's GPT-2 and Llama-style decoder wrapped
by `peft.get_peft_model(model, LoraConfig(r=4, target_modules=[...]))` train like PyTorch
(the referee, 3 steps of SGD with momentum over the causal LM loss; and with peft's dropout on
the adapters' input, the C runtime's masks, and AdamW), and so does BERT with
`task_type="SEQ_CLS"`, where peft trains a copy of the classifier too. Only what peft leaves
trainable trains;
the frozen base stays bit for bit as it was, and the step computes nothing for it: no
optimizer state or update, no embedding gradient, and its LayerNorms' backward is the
dx-only kernel (training/unread_gradients.py). What it saves in the arena against full
fine-tuning: benchmarks/lora_memory.py."""

import importlib.util

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch

import ubitrain as ub

pytest.importorskip("transformers")
if importlib.util.find_spec("peft") is None:  # (imported after transformers: with_lora)
    pytest.skip("peft is not installed", allow_module_level=True)
from tools.hf_models import HF_MODELS, LORA_TARGETS, hf_batches, with_lora  # noqa: E402

SGD = ub.SGD(lr=0.1, momentum=0.9)
# (model, batch, LoraConfig's other arguments, optimizer): peft's defaults, and the dropout
# on the adapters' input and scaling that fine-tuning recipes set, with AdamW
CASES = [("gpt2", 1, {}, SGD), ("gpt2", 4, {}, SGD), ("llama", 1, {}, SGD), ("llama", 4, {}, SGD),
         ("gpt2", 4, dict(lora_dropout=0.1, lora_alpha=16), ub.AdamW(lr=1e-2)),
         ("bert", 4, dict(task_type="SEQ_CLS"), SGD)]  # + a trained copy of the classifier


def _case_id(name, batch, config):
    extra = {"lora_dropout": "-dropout-adamw", "task_type": "-seq-cls"}
    return f"{name}-b{batch}" + "".join(v for k, v in extra.items() if k in config)


@pytest.mark.parametrize("name,batch,config,optimizer", CASES,
                         ids=[_case_id(n, b, c) for n, b, c, _ in CASES])
def test_lora_trains_the_adapters_alone_like_pytorch(name, batch, config, optimizer,
                                                     tmp_path):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = with_lora(HF_MODELS[name].make(), LORA_TARGETS[name], **config)
    adapters = [n for n, p in model.named_parameters() if p.requires_grad]  # peft's choice
    assert adapters and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n
                            for n in adapters)
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    judged = assert_trains_like_torch(model, hf_batches(HF_MODELS[name], batch), optimizer,
                                      tmp_path)
    assert judged.package.trainable == adapters
    final = judged.parameters
    for key, value in initial.items():
        if key not in adapters:
            assert final[key].tobytes() == value.tobytes(), f"{key} moved"
        elif ".lora_A." not in key:  # (A's gradient is B-sized, and B starts at zero: in
            # BERT's nearly uniform attention it stays below float32's resolution of A)
            assert not np.array_equal(final[key], value), f"{key} did not train"
    train = judged.package.programs["train_step"]
    states = {s.label.rsplit(".", 1)[0] for s in train.slots() if s.kind == "optimizer_state"}
    assert states == set(adapters)  # (momentum_buffer, or exp_avg and exp_avg_sq)
    updated = {c.attrs["param"] for c in train.calls if "param" in c.attrs}
    assert updated <= set(adapters)
    kernels = [c.kernel for c in train.calls]
    assert not [k for k in kernels if "embedding_backward" in k]
    assert not [k for k in kernels if "layer_norm_backward" in k]  # only input_backward
