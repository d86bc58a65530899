"""Check one op, forward and backward, as computed by the generated C, against PyTorch.

The op under test is a small module `inner`. `OpProbe` wraps it so that every gradient the
C computes can be read back exactly:

- every model input `x` enters as `x + d_in<i>`, where `d_in<i>` is a zero parameter shaped
  like `x`;
- every parameter `p` of `inner` becomes a buffer holding its value, and the op sees
  `p + d_<p>` with `d_<p>` a zero parameter;
- the op's output `y` leaves as `y + d_out`, with `d_out` a zero parameter.

Only the `d_*` tensors are parameters, so only they train. One step of `SGD(lr=1.0)` on the
MSE loss then leaves `d = 0 - 1 * grad` in every delta: the gradient w.r.t. each input and
each parameter, and (through `d_out = 2 / N * (y - target)`) the training-mode forward
output itself. PyTorch autograd computes the same on a float64 copy of the module.

Whole models are judged by the fidelity referee instead, over several steps:
`harness.assert_trains_like_torch`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from harness import batches as batches  # test_fidelity_regressions.py imports it from here
from harness import rel_err
from torch import nn

import ubitrain as ub

RTOL = 1e-4


def _delta_name(param_name: str) -> str:
    return "d_" + param_name.replace(".", "_")


class OpProbe(nn.Module):
    """`inner` with every input, parameter and the output shifted by a zero parameter."""

    def __init__(self, inner: nn.Module, example_inputs, out_shape):
        super().__init__()
        self.inner = inner
        self.param_names = [n for n, _ in inner.named_parameters()]
        for name in self.param_names:
            owner, leaf = _owner(inner, name)
            value = getattr(owner, leaf).detach().clone()
            del owner._parameters[leaf]
            owner.register_buffer(leaf, value)
            self.register_parameter(_delta_name(name), nn.Parameter(torch.zeros_like(value)))
        for i, x in enumerate(example_inputs):
            self.register_parameter(f"d_in{i}", nn.Parameter(torch.zeros_like(x)))
        self.d_out = nn.Parameter(torch.zeros(out_shape, dtype=example_inputs[0].dtype))

    def forward(self, *xs):
        xs = [x + getattr(self, f"d_in{i}") for i, x in enumerate(xs)]
        shifted = {n: _get(self.inner, n) + getattr(self, _delta_name(n))
                   for n in self.param_names}
        y = torch.func.functional_call(self.inner, shifted, tuple(xs), strict=False)
        return y + self.d_out


def _owner(module: nn.Module, name: str):
    *path, leaf = name.split(".")
    for p in path:
        module = getattr(module, p)
    return module, leaf


def _get(module: nn.Module, name: str):
    owner, leaf = _owner(module, name)
    return getattr(owner, leaf)


@dataclass
class OpResult:
    """What the C computed and what PyTorch computed, by name."""

    got: dict = field(default_factory=dict)
    want: dict = field(default_factory=dict)
    trainer: object = None

    def errors(self) -> dict:
        return {k: rel_err(self.got[k], self.want[k]) for k in self.want}

    def check(self, rtol: float = RTOL):
        errs = self.errors()
        bad = {k: e for k, e in errs.items() if not e <= rtol}
        assert not bad, f"relative errors above {rtol}: {bad} (all: {errs})"


def reference_dropout(masks):
    """Context in which nn.Dropout multiplies by the given masks, in call order."""
    return _MaskedDropout(masks)


class _MaskedDropout:
    def __init__(self, masks):
        self.masks = list(masks)

    def __enter__(self):
        self.saved = nn.Dropout.forward
        masks = iter(self.masks)

        def forward(mod, x):
            if not mod.training or mod.p == 0:
                return x
            return x * torch.as_tensor(next(masks), dtype=x.dtype)

        nn.Dropout.forward = forward
        return self

    def __exit__(self, *exc):
        nn.Dropout.forward = self.saved


def run_op(inner: nn.Module, inputs, tmp_path, seed: int = 0, dropout_masks=None,
           check_predict: bool = True) -> OpResult:
    """Compile `inner` wrapped in an `OpProbe`, take one step and collect both sides."""
    inputs = tuple(torch.as_tensor(x, dtype=torch.float32) for x in inputs)
    inner = inner.float().train()
    with torch.no_grad():  # on a copy: this run moves BatchNorm statistics
        out_shape = copy.deepcopy(inner)(*[x.clone() for x in inputs]).shape
    probe = OpProbe(inner, inputs, out_shape).train()
    ref = copy.deepcopy(probe).double()
    initial_state = {k: v.detach().clone() for k, v in probe.state_dict().items()}
    gen = torch.Generator().manual_seed(1234 + seed)
    # The target is scaled like the output, so that `y - target` keeps y's precision.
    with torch.no_grad(), reference_dropout(dropout_masks or []):
        y0 = copy.deepcopy(ref)(*[x.double() for x in inputs])
    scale = float(y0.abs().max()) or 1.0
    target = (torch.randn(out_shape, generator=gen) * scale).float()

    res = OpResult()
    # ---- PyTorch, float64 -------------------------------------------------------------
    xs64 = [x.double() for x in inputs]
    if check_predict:
        with torch.no_grad():
            res.want["predict"] = copy.deepcopy(ref).eval()(*xs64).numpy()
    with reference_dropout(dropout_masks or []):
        y = ref(*xs64)
    loss = torch.mean((y - target.double()) ** 2)
    loss.backward()
    res.want["loss"] = np.array(loss.item())
    res.want["output"] = y.detach().numpy()
    for name, p in ref.named_parameters():
        res.want["grad:" + name] = p.grad.numpy()
    for name, b in ref.named_buffers():
        if not name.startswith("inner.") or name[len("inner."):] in probe.param_names:
            continue  # frozen parameter values, not state that training changes
        res.want["buffer:" + name] = b.detach().numpy()

    # ---- the generated C --------------------------------------------------------------
    deltas = [n for n, _ in probe.named_parameters()]
    pkg = ub.compile(probe, inputs, target, loss="mse", optimizer=ub.SGD(lr=1.0),
                     trainable=deltas, out_dir=tmp_path / "op")
    assert sorted(pkg.trainable) == sorted(deltas)
    tr = pkg.build(seed=seed)
    res.trainer = tr
    if check_predict:
        res.got["predict"] = tr.predict(*inputs)
    res.got["loss"] = np.array(tr.step(*inputs, target))
    state = tr.parameters()
    for name in deltas:
        res.got["grad:" + name] = -state[name]
    n = int(np.prod(out_shape))
    res.got["output"] = target.numpy().astype(np.float64) - state["d_out"] * (n / 2.0)
    for key in res.want:
        if key.startswith("buffer:"):
            res.got[key] = state[key[len("buffer:"):]]
    # The frozen parameter values must not have moved.
    for name in probe.param_names:
        np.testing.assert_array_equal(state["inner." + name], initial_state["inner." + name])
    return res


# ---- building blocks of op tests ----------------------------------------------------------
def randn(*shape, seed=0, scale=1.0):
    """Reproducible normal values, `scale` times."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def randint(low, high, *shape, seed=0):
    """Reproducible integers as floats: exact ties and kinks (ReLU's 0, a max-pool tie)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=gen).float()


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give a module's parameters reproducible, non-trivial values."""
    gen = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module


class Fn(nn.Module):
    """A stateless op as a module: `fn(*inputs)`."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class WithParam(nn.Module):
    """`fn(x, w)` with `w` a parameter: broadcasting against a trained tensor."""

    def __init__(self, fn, shape, seed=0):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(randn(*shape, seed=50 + seed))

    def forward(self, x):
        return self.fn(x, self.w)


class Probed(nn.Module):
    """`after(before(x) + probe)`: `probe` is a zero parameter, so its gradient is the
    gradient w.r.t. the intermediate `before(x)` (e.g. the exact zeros after a ReLU)."""

    def __init__(self, before, after, mid_shape):
        super().__init__()
        self.before, self.after = before, after
        self.probe = nn.Parameter(torch.zeros(mid_shape))

    def forward(self, x):
        return self.after(self.before(x) + self.probe)


def check(inner, inputs, tmp_path, **kw) -> OpResult:
    """`run_op`, then every tensor within RTOL of PyTorch's."""
    res = run_op(inner, inputs, tmp_path, **kw)
    res.check()
    return res


# ---- whole models judged by the referee: harness.assert_trains_like_torch ----------------
def assert_match(verdict):
    """The referee's verdict is a match; its summary says which check failed otherwise."""
    assert verdict.status == "match", verdict.summary()
