"""Hugging Face `transformers` models in tiny random configurations, as a new user would try
them: for tests/test_hf_models.py, tests/test_hf_lora.py and benchmarks/lora_memory.py.

`transformers` imports torchvision when it is installed, whose C extension does not load
beside the CPU torch (tools/real_models.py says why): `transformers_module()` imports it
with torchvision's op registrations stubbed out, as `torchvision_models()` does.

Each model is wrapped so that it returns its logits tensor (a Hugging Face model returns an
output object). Attention dropout inside scaled_dot_product_attention is switched off
(`attention_probs_dropout_prob=0`, DistilBERT's `attention_dropout=0`): ubitrain refuses a
dropout inside that op; the Dropout layers between the blocks keep PyTorch's default.
`with_lora` puts peft's LoRA adapters into one, as fine-tuning does today.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from tools.real_models import torchvision_models


def transformers_module():
    """`transformers`, imported without torchvision's C-extension registrations."""
    torchvision_models()
    import transformers

    transformers.logging.set_verbosity_error()  # a tiny vocabulary's token-id warnings
    return transformers


class Logits(nn.Module):
    """A Hugging Face model's `.logits`, its only output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits


class PaddedLogits(nn.Module):
    """A Hugging Face model's `.logits` from token ids and their `attention_mask` (1: a
    token, 0: padding), both model inputs: the mask varies per batch."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, attention_mask):
        return self.model(input_ids=x, attention_mask=attention_mask).logits


class PooledEncoder(nn.Module):
    """An encoder's last hidden state, averaged over time, into a linear classifier: an
    audio encoder fine-tuned to classify clips (keyword spotting)."""

    def __init__(self, encoder: nn.Module, width: int, classes: int):
        super().__init__()
        self.encoder = encoder
        self.classifier = nn.Linear(width, classes)

    def forward(self, x):
        return self.classifier(self.encoder(x).last_hidden_state.mean(1))


class NextTokenLogits(nn.Module):
    """A causal LM's logits for every position but the last, one row per token
    [batch * (length - 1), vocabulary]: cross-entropy against the next tokens (the labels
    `hf_batches` gives) is the causal LM loss."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        logits = self.model(x).logits
        return logits[:, :-1].reshape(-1, logits.shape[-1])


@dataclass(frozen=True)
class HFModel:
    name: str
    make: Callable[[], nn.Module]
    # one batch of inputs from (batch, generator): a tensor, or a tuple of the model's inputs
    example_input: Callable[[int, torch.Generator], torch.Tensor | tuple]
    classes: int
    causal_lm: bool = False  # labels: the next token at each position


def _bert():
    tf = transformers_module()
    cfg = tf.BertConfig(vocab_size=VOCABULARY, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64, num_labels=3,
                        attention_probs_dropout_prob=0.0)
    return Logits(tf.BertForSequenceClassification(cfg))


def _padded_tokens(batch: int, gen: torch.Generator):
    """(ids, attention_mask): each sample's tokens, then padding (id 0, mask 0) after a
    random length in [1, SEQUENCE]."""
    ids = torch.randint(1, VOCABULARY, (batch, SEQUENCE), generator=gen)
    lengths = torch.randint(1, SEQUENCE + 1, (batch,), generator=gen)
    mask = (torch.arange(SEQUENCE)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def _distilbert():
    tf = transformers_module()
    cfg = tf.DistilBertConfig(vocab_size=VOCABULARY, dim=32, n_layers=2, n_heads=2,
                              hidden_dim=64, max_position_embeddings=64, num_labels=3,
                              attention_dropout=0.0)
    return Logits(tf.DistilBertForSequenceClassification(cfg))


def _vit():
    tf = transformers_module()
    cfg = tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       num_labels=3, attention_probs_dropout_prob=0.0)
    return Logits(tf.ViTForImageClassification(cfg))


def _gpt2():
    tf = transformers_module()
    cfg = tf.GPT2Config(vocab_size=VOCABULARY, n_embd=64, n_layer=2, n_head=2, n_positions=32,
                        attn_pdrop=0.0)
    return NextTokenLogits(tf.GPT2LMHeadModel(cfg))


def _llama():
    """A Llama-style decoder: RMSNorm, rotary position embeddings (their sines and cosines
    computed in the step from the float buffer `inv_freq`), a SiLU-gated MLP, no biases."""
    tf = transformers_module()
    cfg = tf.LlamaConfig(vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=32)
    return NextTokenLogits(tf.LlamaForCausalLM(cfg))


def _whisper_encoder():
    """Whisper's encoder (two Conv1d with GELU, sinusoidal positions, pre-LayerNorm blocks)
    on log-mel features [batch, MELS, 2 * 8 frames]; the decoder is not used."""
    tf = transformers_module()
    cfg = tf.WhisperConfig(vocab_size=VOCABULARY, num_mel_bins=MELS, d_model=32,
                           encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                           max_source_positions=8, max_target_positions=8,
                           attention_dropout=0.0, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1)
    return PooledEncoder(tf.WhisperModel(cfg).encoder, 32, 3)


def _wav2vec2():
    """wav2vec 2.0 on raw audio [batch, 200 samples]: a convolutional feature encoder (its
    first layer GroupNorm, a group per channel), a weight-normed positional convolution,
    post-LayerNorm blocks. Training-mode extras that draw data-dependent shapes are off:
    SpecAugment's time masks (`apply_spec_augment`) and LayerDrop, whose random skip of a
    whole layer is Python control flow that torch.export cannot trace."""
    tf = transformers_module()
    cfg = tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, conv_dim=(8, 8), conv_stride=(4, 2),
                            conv_kernel=(8, 4), num_conv_pos_embeddings=8,
                            num_conv_pos_embedding_groups=4, attention_dropout=0.0,
                            apply_spec_augment=False, layerdrop=0.0)
    return PooledEncoder(tf.Wav2Vec2Model(cfg), 32, 3)


SEQUENCE = 8
VOCABULARY = 100
MELS = 8
HF_MODELS = {
    "bert": HFModel("bert", _bert,
                    lambda b, g: torch.randint(0, VOCABULARY, (b, SEQUENCE), generator=g), 3),
    "bert_padded": HFModel("bert_padded", lambda: PaddedLogits(_bert().model), _padded_tokens,
                           3),
    "distilbert": HFModel("distilbert", _distilbert,
                          lambda b, g: torch.randint(0, VOCABULARY, (b, SEQUENCE), generator=g),
                          3),
    "vit": HFModel("vit", _vit, lambda b, g: torch.randn(b, 3, 16, 16, generator=g), 3),
    "whisper_encoder": HFModel("whisper_encoder", _whisper_encoder,
                               lambda b, g: torch.randn(b, MELS, 16, generator=g), 3),
    "wav2vec2": HFModel("wav2vec2", _wav2vec2,
                        lambda b, g: torch.randn(b, 200, generator=g), 3),
    "gpt2": HFModel("gpt2", _gpt2, lambda b, g: torch.randint(
        0, VOCABULARY, (b, SEQUENCE), generator=g), VOCABULARY, causal_lm=True),
    "llama": HFModel("llama", _llama, lambda b, g: torch.randint(
        0, VOCABULARY, (b, SEQUENCE), generator=g), VOCABULARY, causal_lm=True),
}


# the modules LoRA adapts, per model: the attention's projections, as peft's own defaults
LORA_TARGETS = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "bert": ["query", "value"]}


def with_lora(wrapper: nn.Module, targets: list[str], rank: int = 4, **config) -> nn.Module:
    """`wrapper` (Logits or NextTokenLogits) with its model wrapped by
    `peft.get_peft_model(model, LoraConfig(r=rank, target_modules=targets, **config))`: the
    base model frozen, adapters A [rank, in] (random) and B [out, rank] (zeros) trained
    beside each target. peft imports transformers, hence after `transformers_module()`."""
    transformers_module()
    import peft

    wrapper.model = peft.get_peft_model(
        wrapper.model, peft.LoraConfig(r=rank, target_modules=targets, **config))
    return wrapper


def hf_batches(model: HFModel, batch: int, steps: int = 3, seed: int = 0):
    """`steps` batches [(input, labels)] of random inputs and labels (a causal LM's: the
    next tokens of its input)."""
    gen = torch.Generator().manual_seed(seed)
    if model.causal_lm:
        inputs = [model.example_input(batch, gen) for _ in range(steps)]
        return [(x, x[:, 1:].reshape(-1)) for x in inputs]
    out = []
    for _ in range(steps):
        x = model.example_input(batch, gen)
        xs = x if isinstance(x, tuple) else (x,)
        out.append((*xs, torch.randint(0, model.classes, (batch,), generator=gen)))
    return out
