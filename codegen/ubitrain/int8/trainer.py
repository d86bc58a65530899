"""The trainer of an int8 package: the generated C's trainer (host or emulated) seen through
the float interface of every ubitrain trainer.

`parameters()` gives float32 weights (int8 value x 2^exponent) by state_dict name;
`int8_state()` the raw arena state (int8 weights, their exponents, the NITI state vector) for
bit-for-bit checks; `rescale_stats()` how many shift reductions the step skipped.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .layers import HEADER
from .rescale import REDUCTIONS, SITE_FIELDS, SKIPS

STATE_NAME = "niti.state"


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
                               int(raw[name + ".exponent"][0])).astype(np.float32)
                for name in self.package.layer_program.weights}

    def load_parameters(self, values: dict) -> None:
        """Float weights are quantized with each weight's exponent (RoundShift, clipped);
        int8 arrays are loaded as they are."""
        raw = self.inner.parameters()
        out = {}
        for name, value in values.items():
            if name not in self.package.layer_program.weights:
                raise InputError(f"unknown parameter name {name!r}; known: "
                                 f"{list(self.package.layer_program.weights)}")
            value = np.asarray(value.detach() if hasattr(value, "detach") else value)
            if value.dtype != np.int8:
                scaled = value.astype(np.float64) / 2.0 ** int(raw[name + ".exponent"][0])
                value = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -127, 127)
                value = value.astype(np.int8)
            out[name] = value
        self.inner.load_parameters(out)

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
