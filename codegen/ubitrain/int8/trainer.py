"""The trainer of an int8 package: the generated C's trainer (host or emulated) seen through
the float interface of every ubitrain trainer.

`parameters()` gives float32 weights (int8 value x 2^exponent) by state_dict name;
`int8_parameters()` the int8 weights with their exponents (`<name>.exponent`), what a fleet
exchanges; `int8_state()` the raw arena state (those and the NITI state vector) for
bit-for-bit checks; `rescale_stats()` how many shift reductions the step skipped.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..niti.rescale import REDUCTIONS, SITE_FIELDS, SKIPS
from .layers import HEADER, STEP_INDEX

STATE_NAME = "niti.state"
EXPONENT = ".exponent"  # the suffix of a weight's exponent


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

    def int8_state(self) -> dict[str, np.ndarray]:
        return {**self.inner.parameters(), **self.inner.optimizer_state()}

    def parameters(self) -> dict[str, np.ndarray]:
        raw = self.inner.parameters()
        return {name: np.ldexp(raw[name].astype(np.float32),
                               int(raw[name + EXPONENT][0])).astype(np.float32)
                for name in self.package.layer_program.weights}

    def int8_parameters(self) -> dict[str, np.ndarray]:
        """The weights as they are trained: int8 values by state_dict name and, under
        `<name>.exponent`, each one's exponent (int32 [1]); weight = value x 2^exponent."""
        raw = self.inner.parameters()
        return {key: raw[key] for name in self.package.layer_program.weights
                for key in (name, name + EXPONENT)}

    def load_parameters(self, values: dict) -> None:
        """Weights by name, and exponents under `<name>.exponent`. An exponent is set first;
        an int8 weight is loaded as it is, a float one quantized with its weight's exponent
        (the one given, else the current one): RoundShift, clipped to +-127. So
        int8_parameters() of one trainer loads into another exactly, whatever exponents it
        had, and parameters() loads back exactly into a trainer with the same exponents."""
        weights = self.package.layer_program.weights
        known = [k for name in weights for k in (name, name + EXPONENT)]
        unknown = [k for k in values if k not in known]
        if unknown:
            raise InputError(f"unknown parameter names {unknown}; known: {known}")
        raw = self.inner.parameters()
        exponents = {}
        for name in weights:
            key = name + EXPONENT
            if key in values:
                exponent = np.asarray(values[key]).reshape(-1)
                if exponent.size != 1 or exponent.dtype.kind not in "iu" \
                        or not -2**31 <= int(exponent[0]) < 2**31:
                    raise InputError(f"parameter {key!r} must be one integer (the power of two "
                                     f"of {name}'s int8 values, an int32), got "
                                     f"{exponent.dtype} {list(np.shape(values[key]))}")
                exponents[name] = int(exponent[0])
            else:
                exponents[name] = int(raw[key][0])
        out = {name + EXPONENT: np.array([exponents[name]], np.int32)
               for name in weights if name + EXPONENT in values}
        for name in weights:
            if name not in values:
                continue
            value = values[name]
            value = np.asarray(value.detach() if hasattr(value, "detach") else value)
            if value.dtype.kind == "f":
                if not np.all(np.isfinite(value)):
                    raise InputError(f"parameter {name!r} holds inf or NaN")
                scaled = value.astype(np.float64) / 2.0 ** exponents[name]
                value = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -127, 127)
                value = value.astype(np.int8)
            out[name] = value
        self.inner.load_parameters(out)

    def reset_optimizer_state(self, step: int = 0) -> None:
        """Zero the NITI state vector (adaptive rescaling's shifts and intervals, the
        reduction counts) and set its count of completed steps to `step`: the mu schedule
        goes on from there. A fleet's client does this at the start of each round."""
        state = np.zeros(self.package.layer_program.state_size, np.int32)
        state[STEP_INDEX] = step
        self.inner.load_optimizer_state({STATE_NAME: state})

    def rescale_stats(self) -> dict:
        """Shift reductions done and skipped in training so far, summed over all sites."""
        state = self.inner.optimizer_state()[STATE_NAME]
        sites = state[HEADER:].reshape(-1, SITE_FIELDS)
        done, skipped = int(sites[:, REDUCTIONS].sum()), int(sites[:, SKIPS].sum())
        return {"reductions": done, "skipped": skipped,
                "skipped_share": skipped / max(done + skipped, 1)}

    def __enter__(self):
        return self

    def close(self):
        getattr(self.inner, "close", lambda: None)()

    def __exit__(self, *exc):
        self.close()
