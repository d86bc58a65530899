"""Random masks in train mode: Dropout, in-place Dropout, bernoulli_ masks, StochasticDepth.
The C runtime draws them; the referee replays its draws (fidelity/dropout.py, reference.py)."""

from __future__ import annotations

from .base import op


@op("dropout", layer=lambda shapes, a: f"nn.Dropout({a['p']})")
def _dropout():
    return (lambda rng, shapes: dict(p=rng.choice([0.1, 0.5])), lambda shapes, a: shapes[0],
            lambda xs, a, name: f"self.{name}({xs[0]})")



# ---- masks PyTorch draws with bernoulli_ (frontend/aten/dropout.py), after the ops above -------
@op("dropout_inplace", layer=lambda shapes, a: (
    f"nn.Sequential(nn.Linear({shapes[0][-1]}, {a['out']}, bias={a['bias']}), "
    f"nn.Dropout({a['p']}, inplace=True))" if a["form"] == "module"
    else f"nn.Linear({shapes[0][-1]}, {a['out']}, bias={a['bias']})"))
def _dropout_inplace():
    """In-place Dropout (nn.Dropout(p, inplace=True), or F.dropout(..., inplace=True)) on a
    Linear's output. Only there: over a value another node reads, or one autograd saved
    (a ReLU's or tanh's output), in place changes what the model computes or makes PyTorch
    refuse the backward, and the shape rules cannot see which values those are."""
    def sample(rng, shapes):
        return dict(form=rng.choice(["module", "functional"]), out=rng.randint(1, 12),
                    bias=rng.random() < 0.8, p=rng.choice([0.1, 0.3, 0.5]))

    def call(xs, a, name):
        if a["form"] == "module":
            return f"self.{name}({xs[0]})"
        return f"F.dropout(self.{name}({xs[0]}), {a['p']}, training=self.training, inplace=True)"
    return sample, lambda shapes, a: (*shapes[0][:-1], a["out"]), call


@op("bernoulli_mask")
def _bernoulli_mask():
    """`x * mask`, the mask of 0s and 1s drawn with `empty_like(x).bernoulli_(keep)` or
    `torch.bernoulli(zeros_like(x), keep)`, maybe scaled by 1 / keep; in training only (a
    mask drawn in eval mode is refused)."""
    def sample(rng, shapes):
        return dict(form=rng.choice(["bernoulli_", "bernoulli"]), keep=rng.choice([0.5, 0.8, 0.9]),
                    scaled=rng.random() < 0.5)

    def call(xs, a, name):
        x, keep = xs[0], a["keep"]
        mask = (f"torch.empty_like({x}).bernoulli_({keep})" if a["form"] == "bernoulli_"
                else f"torch.bernoulli(torch.zeros_like({x}), {keep})")
        scale = f" / {keep}" if a["scaled"] else ""
        return f"({x} * {mask}{scale} if self.training else {x})"
    return sample, lambda shapes, a: shapes[0], call


@op("stochastic_depth",
    layer=lambda shapes, a: f"torchvision_ops().StochasticDepth({a['p']}, {a['mode']!r})")
def _stochastic_depth():
    """torchvision's StochasticDepth: a residual branch dropped per sample ('row') or for the
    whole batch ('batch'), one bernoulli_ draw each, the kept scaled by 1 / (1 - p)."""
    return (lambda rng, shapes: dict(p=rng.choice([0.2, 0.5]), mode=rng.choice(["row", "batch"])),
            lambda shapes, a: shapes[0], lambda xs, a, name: f"self.{name}({xs[0]})")
