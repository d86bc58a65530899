"""PyTorch as the referee: one training step from a given state, in float64 or in float32.

`Reference.step` loads a model state (parameters, buffers, optimizer state) into a copy of
the model in the asked dtype, runs one training step with PyTorch's own optimizer, and
returns the state after it. Starting every step from the state the generated C reached
(teacher forcing, referee.py) keeps float32 rounding from compounding over steps. Dropout
applies the masks the C runtime draws from the same generator state (dropout.py).

A float32 run can be one of PyTorch's `Variant`s: inputs and state moved by one rounding,
other thread counts, the channels-last layout. How far such runs land from the float64 run
says how far a correct float32 implementation may land on this model and step; the referee
derives its tolerance from it.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..optim import SGD, Adam, AdamW
from .dropout import dropout_mask
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


class _UbDropout(TorchFunctionMode):
    """F.dropout in training mode multiplies by the C runtime's next mask."""

    def __init__(self, rng_state: int):
        super().__init__()
        self.rng_state = rng_state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            x = args[0]
            p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if not training or p == 0:
                return x
            mask, self.rng_state = dropout_mask(self.rng_state, tuple(x.shape), p)
            return x * torch.from_numpy(mask).to(x.dtype)
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


@dataclass(frozen=True)
class Variant:
    """One of PyTorch's own ways to run a float32 step: inputs and state moved by about one
    rounding (`perturb`, a seed), other thread counts (other summation orders in its
    reductions) and the channels-last layout without oneDNN (other conv and BatchNorm
    kernels). How far such runs land from the float64 one is how far a correct float32
    implementation may land: the referee's yardstick."""

    perturb: int | None = None
    threads: int = 1
    channels_last: bool = False

    def generator(self):
        return torch.Generator().manual_seed(self.perturb) if self.perturb is not None else None

    def tensor(self, t: torch.Tensor, gen) -> torch.Tensor:
        if gen is not None:  # a relative 2^-24 of random sign: about one float32 rounding
            t = t * (1 + (torch.randint(0, 3, t.shape, generator=gen).to(t.dtype) - 1)
                     * 2.0 ** -24)
        if self.channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    @contextlib.contextmanager
    def settings(self):
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with warnings.catch_warnings():  # oneDNN's note on Intel GPUs, at every switch
                warnings.simplefilter("ignore", UserWarning)
                flags = torch.backends.mkldnn.flags(enabled=not self.channels_last)
                flags.__enter__()
            try:
                yield
            finally:
                flags.__exit__(None, None, None)
        finally:
            torch.set_num_threads(threads)


EXACT = Variant()
FLOAT32_VARIANTS = (Variant(), Variant(perturb=1, threads=2),
                    Variant(perturb=2, channels_last=True))


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
        return {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}

    def _instance(self, state, dtype, variant: Variant):
        gen = variant.generator()
        m = copy.deepcopy(self.model)
        values = {k: _tensor(v) for k, v in state.items()}
        values = {k: variant.tensor(v.to(dtype), gen) if v.dtype.is_floating_point else v
                  for k, v in values.items()}
        m = m.to(dtype)
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
             variant: Variant = EXACT, record: bool = False) -> StepResult:
        """One step (the `step`-th, 1-based) from `state` and `opt_state` on `batch`
        = (x..., y)."""
        m, gen = self._instance(state, dtype, variant)
        m.train()
        params = dict(m.named_parameters())
        trained = [params[n] for n in self.trainable]
        for name, p in params.items():
            p.requires_grad_(name in self.trainable)
        opt = torch_optimizer(self.optimizer, trained)
        names = tuple(self.optimizer.state_names)
        if step > 1 and names:
            for n, p in zip(self.trainable, trained):
                slot = {s: _tensor(opt_state[f"{n}.{s}"]).to(dtype) for s in names}
                if isinstance(self.optimizer, Adam):
                    slot["step"] = torch.tensor(float(step - 1))
                opt.state[p] = slot
        *xs, y = batch
        xs = self._inputs(xs, dtype, variant, gen)
        target = _tensor(y)
        if target.dtype.is_floating_point:
            target = target.to(dtype)
        recorder = DecisionRecorder() if record else contextlib.nullcontext()
        with variant.settings(), _UbDropout(rng_state) as dropout, _ContiguousGradients(), \
                recorder:
            loss = LOSSES[self.loss](m(*xs), target)
            if self.trainable:
                loss.backward()
            opt.step()
        new_opt = {f"{n}.{s}": opt.state[p][s].detach().double().numpy().copy()
                   for n, p in zip(self.trainable, trained) for s in names}
        new_state = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
        return StepResult(new_state, new_opt, float(loss.detach()),
                          recorder.decisions if record else None, dropout.rng_state)

    def evaluate(self, state, xs, dtype=torch.float64, variant: Variant = EXACT,
                 record: bool = False) -> EvalResult:
        """The eval-mode forward (what `trainer.predict` computes) from `state`."""
        m, gen = self._instance(state, dtype, variant)
        m.eval()
        recorder = DecisionRecorder() if record else contextlib.nullcontext()
        with variant.settings(), torch.no_grad(), recorder:
            out = m(*self._inputs(xs, dtype, variant, gen))
        return EvalResult(out.double().numpy(), recorder.decisions if record else None)
