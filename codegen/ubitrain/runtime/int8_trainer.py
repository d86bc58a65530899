"""The trainer of an int8 package: the generated C's trainer (host or emulated) seen through
the float interface of every ubitrain trainer.

`parameters()` gives float32 parameters (integer value x 2^exponent) by state_dict name;
`int8_parameters()` the integer ones (int8 weights, int32 biases) with their exponents
(`<name>.exponent`), what a fleet exchanges; `int8_state()` the raw state (those and the
rescale sites) for bit-for-bit checks; `rescale_stats()` how many shift reductions adaptive
rescaling skipped.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..niti.channel_exponents import by_channel
from ..niti.rescale import REDUCTIONS, SITE_FIELDS, SKIPS

EXPONENT = ".exponent"  # the suffix of a parameter's exponent
SITE = "niti.site"  # the prefix of the rescale sites' state tensors (training/niti_module.py)
LIMITS = {np.dtype(np.int8): 127, np.dtype(np.int32): 2**31 - 1}


class Int8Trainer:
    def __init__(self, inner, package):
        self.inner, self.package = inner, package

    def __getattr__(self, name):  # close, steps, command, device_memory, save, restore, ...
        return getattr(self.inner, name)

    def step(self, *batch) -> float:
        return self.inner.step(*batch)

    def train(self, batches) -> np.ndarray:
        return self.inner.train(batches)

    def predict(self, *xs) -> np.ndarray:
        return self.inner.predict(*xs)

    @property
    def _names(self) -> list[str]:
        return list(self.package.integer_parameters)

    def int8_state(self) -> dict[str, np.ndarray]:
        return {**self.inner.parameters(), **self.inner.optimizer_state()}

    def parameters(self) -> dict[str, np.ndarray]:
        raw = self.inner.parameters()
        return {name: np.ldexp(raw[name].astype(np.float64),
                               by_channel(raw[name + EXPONENT], raw[name].ndim)
                               ).astype(np.float32)
                for name in self._names}

    def int8_parameters(self) -> dict[str, np.ndarray]:
        """The parameters as they are trained: integer values by state_dict name and, under
        `<name>.exponent`, each one's exponent (int32 [1], or [C] for a weight with one per
        output channel); value x 2^exponent."""
        raw = self.inner.parameters()
        return {key: raw[key] for name in self._names for key in (name, name + EXPONENT)}

    def load_parameters(self, values: dict) -> None:
        """Parameters by name, and exponents under `<name>.exponent`. An exponent is set
        first; an integer value is loaded as it is, a float one quantized with its
        parameter's exponent (the one given, else the current one): rounded half away from
        zero, clipped to the integer type (+-127 for an int8 weight). So int8_parameters() of
        one trainer loads into another exactly, whatever exponents it had, and parameters()
        loads back exactly into a trainer with the same exponents."""
        names = self._names
        known = [k for name in names for k in (name, name + EXPONENT)]
        unknown = [k for k in values if k not in known]
        if unknown:
            raise InputError(f"unknown parameter names {unknown}; known: {known}")
        raw = self.inner.parameters()
        exponents = {name: _exponent(name, values[name + EXPONENT], raw[name + EXPONENT].shape)
                     if name + EXPONENT in values else raw[name + EXPONENT]
                     for name in names}
        out = {name + EXPONENT: exponents[name] for name in names if name + EXPONENT in values}
        for name in names:
            if name not in values:
                continue
            value = values[name]
            value = np.asarray(value.detach() if hasattr(value, "detach") else value)
            if value.dtype.kind == "f":
                if not np.all(np.isfinite(value)):
                    raise InputError(f"parameter {name!r} holds inf or NaN")
                limit = LIMITS[raw[name].dtype]
                scaled = np.ldexp(value.astype(np.float64),
                                  -by_channel(exponents[name], value.ndim))
                value = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -limit, limit)
                value = value.astype(raw[name].dtype)
            out[name] = value
        self.inner.load_parameters(out)

    def reset_optimizer_state(self, step: int = 0) -> None:
        """Zero the rescale sites (adaptive rescaling's shifts and intervals, the reduction
        counts) and set the count of completed steps to `step`: the mu schedule goes on from
        there. A fleet's client does this at the start of each round."""
        self.inner.load_parameters({k: np.zeros_like(v) for k, v in self._sites().items()})
        self.inner.steps = step

    def _sites(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.inner.parameters().items() if k.startswith(SITE)}

    def rescale_stats(self) -> dict:
        """Shift reductions done and skipped in training so far, summed over all sites."""
        rows = np.concatenate([np.zeros(0, np.int32), *self._sites().values()])
        sites = rows.reshape(-1, SITE_FIELDS)
        done, skipped = int(sites[:, REDUCTIONS].sum()), int(sites[:, SKIPS].sum())
        return {"sites": len(sites), "reductions": done, "skipped": skipped,
                "skipped_share": skipped / max(done + skipped, 1)}

    def __enter__(self):
        return self

    def close(self):
        getattr(self.inner, "close", lambda: None)()

    def __exit__(self, *exc):
        self.close()


def _exponent(name: str, given, shape: tuple) -> np.ndarray:
    exponent = np.asarray(given).reshape(-1)
    if exponent.shape != tuple(shape) or exponent.dtype.kind not in "iu" \
            or np.any(exponent < -2**31) or np.any(exponent >= 2**31):
        what = "one integer" if shape == (1,) else f"{shape[0]} integers, one per output channel"
        raise InputError(f"parameter {name + EXPONENT!r} must be {what} (the power of two of "
                         f"{name}'s integer values, an int32), got {exponent.dtype} "
                         f"{list(np.shape(given))}")
    return exponent.astype(np.int32)
