"""PyTorch as the referee: one training step from a given state, in float64 or in float32.

`Reference.step` loads a model state (parameters, buffers, optimizer state) into a copy of
the model in the asked dtype, runs one training step with PyTorch's own optimizer, and
returns the state after it. Starting every step from the state the generated C reached
(teacher forcing, referee.py) keeps float32 rounding from compounding over steps. Dropout
and `bernoulli_` (in-place Dropout, StochasticDepth) apply the masks the C runtime draws
from the same generator state (dropout.py).

A float32 run can be one of PyTorch's `Variant`s: inputs, state and every op's result moved
by an ulp at random, other thread counts, the channels-last layout. How far such runs land
from the float64 run says how far a correct float32 implementation may land on this model
and step; the referee derives its tolerance from it.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..optim import SGD, Adam, AdamW
from .dropout import bernoulli_mask, dropout_mask
from .kinks import DecisionRecorder, Decisions

LOSSES = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}


@dataclass
class StepResult:
    state: dict[str, np.ndarray]  # state_dict names
    opt_state: dict[str, np.ndarray]  # "<parameter>.<state>", as trainer.optimizer_state()
    loss: float
    decisions: Decisions | None = None
    rng_state: int = 0  # the Dropout generator after the step's masks


@dataclass
class EvalResult:
    output: np.ndarray
    decisions: Decisions | None = None


class _CGenerator:
    """The C runtime's generator state, advanced by every mask the step draws, in order."""

    def __init__(self, state: int):
        self.state = state


class _UbDropout(TorchFunctionMode):
    """F.dropout in training mode multiplies by the C runtime's next Dropout mask. In-place
    Dropout is left to PyTorch: its `bernoulli_` draws are the C's (_UbBernoulli), as in
    the exported graph the C runs."""

    def __init__(self, rng: _CGenerator):
        super().__init__()
        self.rng = rng

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout and not kwargs.get("inplace", args[3] if len(args) > 3 else False):
            x = args[0]
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if not training or p == 0:
                return x
            mask, self.rng.state = dropout_mask(self.rng.state, tuple(x.shape), p)
            return x * torch.from_numpy(mask).to(x.dtype)
        return func(*args, **kwargs)


class _UbBernoulli(TorchDispatchMode):
    """`bernoulli_(p)` and `bernoulli(x, p)` with a float p take the C runtime's next draws
    (what in-place Dropout, dropout2d and torchvision's stochastic_depth call inside);
    everything PyTorch does with them around that stays PyTorch's own."""

    def __init__(self, rng: _CGenerator):
        super().__init__()
        self.rng = rng

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli.p):
            x, p = args[0], kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            mask, self.rng.state = bernoulli_mask(self.rng.state, tuple(x.shape), p)
            mask = torch.from_numpy(mask).to(x.dtype)
            return x.copy_(mask) if func is torch.ops.aten.bernoulli_.float else mask
        return func(*args, **kwargs)


class _ContiguousGradients(TorchDispatchMode):
    """Backward kernels get contiguous tensors. PyTorch 2.13's CPU BatchNorm backward is
    wrong when the incoming gradient is a permuted view of a tensor with a size-1 dim
    (bn(x).permute(0, 3, 2, 1) with x of shape [2, 4, 1, 3] fails torch.autograd.gradcheck,
    and passes once the gradient is made contiguous): the referee must not inherit such a
    layout bug, and a copy changes no value."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0].endswith("_backward"):
            args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
        return func(*args, **(kwargs or {}))


def torch_optimizer(optimizer, params):
    """The torch.optim optimizer of a ubitrain optimizer, with the same settings."""
    if isinstance(optimizer, SGD):
        return torch.optim.SGD(params, lr=optimizer.lr, momentum=optimizer.momentum,
                               dampening=optimizer.dampening,
                               weight_decay=optimizer.weight_decay, nesterov=optimizer.nesterov)
    cls = torch.optim.AdamW if isinstance(optimizer, AdamW) else torch.optim.Adam
    assert isinstance(optimizer, Adam)
    return cls(params, lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
               weight_decay=optimizer.weight_decay)


def _tensor(value) -> torch.Tensor:
    """A copy of a numpy array or tensor, as a tensor."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return torch.from_numpy(np.array(value))


def _nudged(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` with each element moved by one ulp up, one down, or not at all, at random; zeros
    stay zero, as under any rounding of an exact zero. (Nudged, Adam's second moment of a
    gradient that is exactly 0 fell below zero and its square root was NaN: such a run said
    nothing about any element, and the spread came from the other runs alone; fuzz seed
    73559.) Infinities stay infinite too: an attention mask's -inf is exact, and nudged to
    -3.4e38 a row that attends to nothing was no longer all -inf, so PyTorch's safe softmax
    gave it uniform weights instead of zeros, and that run's spread let a C that did the
    same pass (tests/test_attention_mask_input.py)."""
    if not t.dtype.is_floating_point or t.numel() == 0:
        return t
    way = torch.randint(0, 3, t.shape, generator=gen)
    up, down = torch.nextafter(t, torch.full_like(t, float("inf"))), \
        torch.nextafter(t, torch.full_like(t, float("-inf")))
    way = torch.where((t == 0) | t.isinf(), 0, way)
    return torch.where(way == 1, up, torch.where(way == 2, down, t))


class _RoundingNoise(TorchDispatchMode):
    """Every float result of every op (forward and backward) moved by an ulp at random: the
    rounding of another, equally correct float32 implementation, everywhere in the step.
    Views and in-place ops are left alone (a copy would break their aliasing), and so are
    clones: a copy rounds nothing, and the clone autograd saves of an in-place op's input
    (hardtanh_, clamp_) must hold the values the op decided its branch on (sides.py)."""

    def __init__(self, gen: torch.Generator):
        super().__init__()
        self.gen = gen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.clone.default or \
                any(r.alias_info is not None for r in func._schema.returns):
            return out
        if isinstance(out, torch.Tensor):
            return _nudged(out, self.gen)
        if isinstance(out, tuple):
            return tuple(_nudged(o, self.gen) if isinstance(o, torch.Tensor) else o
                         for o in out)
        return out


@dataclass(frozen=True)
class Variant:
    """One of the ways a correct float32 implementation may compute a step: with `noise` (a
    seed), inputs, state and every op's result moved by an ulp at random (another rounding
    everywhere); with other thread counts (other summation orders in PyTorch's reductions);
    in the channels-last layout without oneDNN (other conv and BatchNorm kernels). How far
    such runs land from the float64 one is the referee's yardstick."""

    noise: int | None = None
    threads: int = 1
    channels_last: bool = False

    def generator(self):
        return torch.Generator().manual_seed(self.noise) if self.noise is not None else None

    def tensor(self, t: torch.Tensor, gen) -> torch.Tensor:
        if gen is not None:
            t = _nudged(t, gen)
        if self.channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    @contextlib.contextmanager
    def settings(self, gen=None):
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        noise = _RoundingNoise(gen) if gen is not None else contextlib.nullcontext()
        try:
            with warnings.catch_warnings():  # oneDNN's note on Intel GPUs, at every switch
                warnings.simplefilter("ignore", UserWarning)
                flags = torch.backends.mkldnn.flags(enabled=not self.channels_last)
                flags.__enter__()
            try:
                with noise:
                    yield
            finally:
                flags.__exit__(None, None, None)
        finally:
            torch.set_num_threads(threads)


EXACT = Variant()
FLOAT32_VARIANTS = (Variant(), Variant(noise=1, threads=2),
                    Variant(noise=2, channels_last=True))
# Where the C fails against those three, the spread is measured again over 16 more noisy runs
# before the step is called a mismatch: three runs are a small sample of the spread of a
# value that is mostly cancellation (fuzz seed 71: the gradient of a BatchNorm's scale right
# before another BatchNorm, zero but for eps; the C's error was the median of 40 such runs
# and 10 times the largest of the three).
MORE_FLOAT32_VARIANTS = tuple(Variant(noise=n, threads=1 + n % 2) for n in range(3, 19))


def _non_persistent_buffers(m: torch.nn.Module) -> list[str]:
    """The buffers state_dict leaves out (`register_buffer(..., persistent=False)`, such as
    BERT's position_ids): the C keeps them as state like any other buffer."""
    saved = m.state_dict()
    return [n for n, _ in m.named_buffers() if n not in saved]


def _full_state(m: torch.nn.Module) -> dict:
    """state_dict and the non-persistent buffers: every tensor the C's state has."""
    state = m.state_dict()
    state.update((n, m.get_buffer(n)) for n in _non_persistent_buffers(m))
    return state


@dataclass
class Reference:
    model: torch.nn.Module  # the model as compiled (float32, its initial state)
    optimizer: object  # ub.SGD / ub.Adam / ub.AdamW
    loss: str
    trainable: list[str]
    _param_names: list[str] = field(init=False)

    def __post_init__(self):
        self.model = copy.deepcopy(self.model).float()
        self._param_names = [n for n, _ in self.model.named_parameters()]

    def initial_state(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in _full_state(self.model).items()}

    def _instance(self, state, dtype, variant: Variant):
        gen = variant.generator()
        m = copy.deepcopy(self.model)
        values = {k: _tensor(v) for k, v in state.items()}
        values = {k: variant.tensor(v.to(dtype), gen) if v.dtype.is_floating_point else v
                  for k, v in values.items()}
        m = m.to(dtype)
        # the module's own metadata too: some check their version when loading (MNASNet)
        values = OrderedDict(values)
        values._metadata = getattr(m.state_dict(), "_metadata", None)
        loose = _non_persistent_buffers(m)
        for name in loose:
            m.get_buffer(name).copy_(values.pop(name))
        m.load_state_dict(values)
        if variant.channels_last:
            m = m.to(memory_format=torch.channels_last)
        return m, gen

    def _inputs(self, xs, dtype, variant: Variant, gen):
        out = []
        for x in xs:
            t = _tensor(x)
            out.append(variant.tensor(t.to(dtype), gen) if t.dtype.is_floating_point else t)
        return out

    def step(self, state, opt_state, step: int, batch, rng_state: int, dtype=torch.float64,
             variant: Variant = EXACT, record: bool = False,
             recorder: DecisionRecorder | None = None) -> StepResult:
        """One step (the `step`-th, 1-based) from `state` and `opt_state` on `batch`
        = (x..., y). `record`: keep the kink decisions (in `recorder` when given: a
        sides.SideReplay also forces some)."""
        m, gen = self._instance(state, dtype, variant)  # each module in the mode compiled
        params = dict(m.named_parameters())
        trained = [params[n] for n in self.trainable]
        for name, p in params.items():
            p.requires_grad_(name in self.trainable)
        opt = torch_optimizer(self.optimizer, trained)
        names = tuple(self.optimizer.state_names)
        if step > 1 and names:
            for n, p in zip(self.trainable, trained):
                if f"{n}.{names[0]}" not in opt_state:  # no gradient at the earlier steps
                    continue
                slot = {s: _tensor(opt_state[f"{n}.{s}"]).to(dtype) for s in names}
                if isinstance(self.optimizer, Adam):
                    slot["step"] = torch.tensor(float(step - 1))
                opt.state[p] = slot
        *xs, y = batch
        xs = self._inputs(xs, dtype, variant, gen)
        target = _tensor(y)
        if target.dtype.is_floating_point:
            target = target.to(dtype)
        record = record or recorder is not None
        recorder = recorder or (DecisionRecorder() if record else contextlib.nullcontext())
        rng = _CGenerator(rng_state)
        with variant.settings(gen), _UbDropout(rng), _UbBernoulli(rng), \
                _ContiguousGradients(), recorder:
            loss = LOSSES[self.loss](m(*xs), target)
            if self.trainable:
                loss.backward()
            if self.optimizer.clip_grad_norm is not None:  # skips the ones with no gradient
                torch.nn.utils.clip_grad_norm_(trained, self.optimizer.clip_grad_norm)
            opt.step()
        # a parameter that the loss does not reach has no gradient, so PyTorch's optimizer
        # keeps no state for it (nor does the C train it)
        new_opt = {f"{n}.{s}": opt.state[p][s].detach().double().numpy().copy()
                   for n, p in zip(self.trainable, trained) if p in opt.state for s in names}
        new_state = {k: v.detach().numpy().copy() for k, v in _full_state(m).items()}
        return StepResult(new_state, new_opt, float(loss.detach()),
                          recorder.decisions if record else None, rng.state)

    def evaluate(self, state, xs, dtype=torch.float64, variant: Variant = EXACT,
                 record: bool = False) -> EvalResult:
        """The eval-mode forward (what `trainer.predict` computes) from `state`."""
        m, gen = self._instance(state, dtype, variant)
        m.eval()
        recorder = DecisionRecorder() if record else contextlib.nullcontext()
        with variant.settings(gen), torch.no_grad(), recorder:
            out = m(*self._inputs(xs, dtype, variant, gen))
        return EvalResult(out.double().numpy(), recorder.decisions if record else None)
