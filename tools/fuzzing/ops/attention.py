"""Attention: F.scaled_dot_product_attention and nn.MultiheadAttention."""

from __future__ import annotations

from .base import Shape, op


def _attention_shapes(q: Shape, kv: Shape) -> bool:
    """Queries and keys/values of the same leading axes and features; the key length may
    differ from the query's."""
    return len(q) >= 3 and len(q) == len(kv) and q[:-2] == kv[:-2] and q[-1] == kv[-1]


def _sdpa_mask(shapes, a) -> str | None:
    """The constant mask, a plain tensor attribute (None: no mask): boolean (True: attend;
    a row may attend to nothing, which PyTorch makes zeros) or additive float."""
    if a["mask"] is None:
        return None
    rows, cols = shapes[0][-2], shapes[1][-2]
    gen = f"generator=torch.Generator().manual_seed({a['mask_seed']})"
    if a["mask"] == "bool":
        return f"torch.rand({rows}, {cols}, {gen}) < 0.7"
    return f"torch.randn({rows}, {cols}, {gen})"


@op("scaled_dot_product_attention", arity=2, layer=_sdpa_mask)
def _scaled_dot_product_attention():
    """F.scaled_dot_product_attention(q, kv, kv) over the last two axes (length, features),
    the axes before them batch and heads: causal, a constant mask or none, a scale."""
    def sample(rng, shapes):
        if not _attention_shapes(*shapes):
            return None
        mask = rng.choice([None, None, "causal", "bool", "float"])
        return dict(mask=None if mask == "causal" else mask, causal=mask == "causal",
                    mask_seed=rng.randrange(1000), scale=rng.choice([None, None, 0.3, 1.7]))

    def infer(shapes, a):
        return shapes[0] if _attention_shapes(*shapes) else None

    def call(xs, a, name):
        extra = ", is_causal=True" if a["causal"] else ""
        extra += f", attn_mask=self.{name}" if a["mask"] else ""
        extra += f", scale={a['scale']}" if a["scale"] is not None else ""
        return f"F.scaled_dot_product_attention({xs[0]}, {xs[1]}, {xs[1]}{extra})"
    return sample, infer, call


@op("multihead_attention", arity=2,
    layer=lambda shapes, a: f"nn.MultiheadAttention({shapes[0][-1]}, {a['heads']}, "
                            f"bias={a['bias']}, batch_first={a['batch_first']})")
def _multihead_attention():
    """nn.MultiheadAttention(query, kv, kv) on 3-D values; batch_first=False reads the batch
    axis as the sequence (attention across the samples, as PyTorch does)."""
    def sample(rng, shapes):
        q, kv = shapes
        if len(q) != 3 or not _attention_shapes(q, kv):
            return None
        heads = rng.choice([h for h in (1, 2, 3, 4) if q[-1] % h == 0])
        return dict(heads=heads, bias=rng.random() < 0.8, batch_first=rng.random() < 0.7,
                    need_weights=rng.random() < 0.5)

    def infer(shapes, a):
        q, kv = shapes
        if len(q) != 3 or not _attention_shapes(q, kv) or q[-1] % a["heads"]:
            return None
        return q if a["batch_first"] or q[1] == kv[1] else None

    def call(xs, a, name):
        return f"self.{name}({xs[0]}, {xs[1]}, {xs[1]}, need_weights={a['need_weights']})[0]"
    return sample, infer, call

