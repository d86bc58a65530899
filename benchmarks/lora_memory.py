"""Arena of LoRA fine-tuning against full fine-tuning of the same Hugging Face model.

    python benchmarks/lora_memory.py [--batches 1,4,8] [--out results/lora_memory.json]

tools/hf_models.py's GPT-2 and Llama-style decoder (tiny random configurations, sequences
of 8 tokens, the causal LM loss), AdamW: full fine-tuning trains every parameter; LoRA is
`peft.get_peft_model(model, LoraConfig(r=4, target_modules=...))` (tools/hf_models.py's
LORA_TARGETS), which trains the adapters alone. Per case, on the host: the arena, its
persistent state (parameters, buffers, optimizer state) and the working memory of the step
(the rest: activations kept for the backward pass, gradients, scratch), in bytes; and the
arena compiled for cortex-m4, where the frozen base stays in flash (only compiled, not
built: no toolchain needed).
"""

import argparse
import tempfile
import warnings
from pathlib import Path

import torch
from _results import write_json

import ubitrain as ub
from tools.hf_models import HF_MODELS, LORA_TARGETS, hf_batches, with_lora


def _arena(model, batch, name, target):
    x, y = hf_batches(HF_MODELS[name], batch, steps=1)[0]
    with tempfile.TemporaryDirectory() as tmp:
        pkg = ub.compile(model, (x,), y, optimizer=ub.AdamW(lr=1e-3), target=target,
                         out_dir=Path(tmp) / "m")
    return pkg.memory_plan


def _plan(make, batch, name):
    torch.manual_seed(0)
    model = make()
    plan = _arena(model, batch, name, "host")
    return dict(arena=plan.arena_bytes, persistent=plan.persistent_bytes,
                working=plan.arena_bytes - plan.persistent_bytes,
                optimizer_state=plan.bytes_by_kind().get("optimizer_state", 0),
                cortex_m4_arena=_arena(model, batch, name, "cortex-m4").arena_bytes,
                trained=sum(p.numel() for p in model.parameters() if p.requires_grad),
                parameters=sum(p.numel() for p in model.parameters()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--out", type=Path, default=Path("results/lora_memory.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    print(f"{'model':<6}{'batch':>6}{'full arena':>12}{'LoRA arena':>12}{'ratio':>7}"
          f"{'full state':>12}{'LoRA state':>12}{'full work':>12}{'LoRA work':>12}"
          f"{'full M4':>12}{'LoRA M4':>12}{'ratio':>7}")
    for name in ("gpt2", "llama"):
        for batch in (int(b) for b in args.batches.split(",")):
            full = _plan(HF_MODELS[name].make, batch, name)
            lora = _plan(lambda n=name: with_lora(HF_MODELS[n].make(), LORA_TARGETS[n]),
                         batch, name)
            rows.append(dict(model=name, batch=batch, full=full, lora=lora))
            m4 = full["cortex_m4_arena"], lora["cortex_m4_arena"]
            print(f"{name:<6}{batch:>6}{full['arena']:>12,}{lora['arena']:>12,}"
                  f"{full['arena'] / lora['arena']:>6.2f}x{full['persistent']:>12,}"
                  f"{lora['persistent']:>12,}{full['working']:>12,}{lora['working']:>12,}"
                  f"{m4[0]:>12,}{m4[1]:>12,}{m4[0] / m4[1]:>6.2f}x", flush=True)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
