"""F.pad over the last one or two non-batch axes, in every mode; constant pads may crop.
PyTorch pads k axes in the other modes only of a tensor of k + 1 or k + 2 dims."""

from __future__ import annotations

from .base import op


@op("pad")
def _pad():
    def sample(rng, shapes):
        rank = len(shapes[0])
        if rank < 2:
            return None
        mode = rng.choice(["constant", "constant", "reflect", "replicate", "circular"])
        ks = [k for k in (1, 2) if k < rank and (mode == "constant" or rank - k <= 2)]
        if not ks:
            return None
        widths = []
        for d in range(rank - 1, rank - 1 - rng.choice(ks), -1):
            size = shapes[0][d]
            most = {"reflect": size - 1, "circular": size}.get(mode, 3)
            least = -(size - 1) // 2 if mode == "constant" else 0
            widths += [rng.randint(least, max(least, min(most, 3))) for _ in range(2)]
        return dict(mode=mode, widths=widths, value=rng.choice([0.0, 0.0, 1.5, -0.5]))

    def infer(shapes, a):
        shape, widths = list(shapes[0]), a["widths"]
        k = len(widths) // 2
        if k > len(shape) - 1 or (a["mode"] != "constant" and len(shape) - k > 2):
            return None
        for i in range(k):
            d, (before, after) = len(shape) - 1 - i, widths[2 * i:2 * i + 2]
            limit = {"reflect": shape[d] - 1, "circular": shape[d]}.get(a["mode"])
            if limit is not None and (min(before, after) < 0 or max(before, after) > limit):
                return None
            shape[d] += before + after
            if shape[d] < 1:
                return None
        return tuple(shape)

    def call(xs, a, name):
        value = f", value={a['value']}" if a["mode"] == "constant" and a["value"] else ""
        return f"F.pad({xs[0]}, {tuple(a['widths'])}, mode={a['mode']!r}{value})"
    return sample, infer, call
