"""Indexing by a constant tensor (frontend/aten/indexing.py): `x[:, idx]` along a non-batch
axis, `x[..., idx]` along the last, `torch.index_select(x, d, idx)`; the index a plain tensor
attribute or a `torch.tensor` made in forward. Repeated indices (their gradients sum) and,
where PyTorch takes them, negative ones; a 2-D index on values of rank 2 or 3."""

from __future__ import annotations

from .base import op


def _index_layer(shapes, a) -> str | None:
    return f"torch.tensor({a['idx']})" if a["where"] == "attribute" else None


@op("index", layer=_index_layer)
def _index():
    def sample(rng, shapes):
        shape = shapes[0]
        form = rng.choice(["subscript", "ellipsis", "index_select"])
        d = len(shape) - 1 if form == "ellipsis" else rng.randrange(1, len(shape))
        size = shape[d]
        low = 0 if form == "index_select" else -size
        count = rng.randint(1, size + 2)  # more indices than elements: some repeat
        idx = [rng.randint(low, size - 1) for _ in range(count)]
        if form != "index_select" and len(shape) <= 3 and rng.random() < 0.25:
            rows = rng.randint(2, 3)  # a 2-D index: its shape replaces the axis
            idx = [[rng.randint(low, size - 1) for _ in range(count)] for _ in range(rows)]
        return dict(form=form, d=d, idx=idx, where=rng.choice(["attribute", "inline"]))

    def infer(shapes, a):
        shape = shapes[0]
        d, idx = a["d"], a["idx"]
        if not 1 <= d < len(shape) or (a["form"] == "ellipsis" and d != len(shape) - 1):
            return None
        flat = [i for row in idx for i in row] if isinstance(idx[0], list) else idx
        low = 0 if a["form"] == "index_select" else -shape[d]
        if not all(low <= i < shape[d] for i in flat):
            return None
        dims = [len(idx), len(idx[0])] if isinstance(idx[0], list) else [len(idx)]
        return (*shape[:d], *dims, *shape[d + 1:])

    def call(xs, a, name):
        idx = f"self.{name}" if a["where"] == "attribute" else f"torch.tensor({a['idx']})"
        if a["form"] == "index_select":
            return f"torch.index_select({xs[0]}, {a['d']}, {idx})"
        if a["form"] == "ellipsis":
            return f"{xs[0]}[..., {idx}]"
        return f"{xs[0]}[{':, ' * a['d']}{idx}]"
    return sample, infer, call
