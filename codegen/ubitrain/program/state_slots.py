"""The slots of the model's state (parameters and buffers, whole) and of the optimizer's
state, and the parts of weights that train by channels as views into their weight."""

from __future__ import annotations

import numpy as np

from .ir import Slot


def c_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def state_slots(tm, optimizer):
    """(state slots by name, optimizer state slots by trained name, the parts of weights
    trained by channels as views into their weight's slot, by part name)."""
    state = {}
    for s in tm.predict_graph.state:  # the model's state, whole
        kind = "parameter" if s.is_parameter else "buffer"
        state[s.name] = Slot(c_name(s.name), s.value.shape, str(s.value.dtype), kind, s.value,
                             label=s.name)
    parts = {}
    for split in (s for s in tm.channel_splits if s.partial):
        whole = state[split.param]
        row_bytes = whole.nbytes // split.channels
        for name, start, stop in ((split.trained_name, 0, split.trained),
                                  (split.frozen_name, split.trained, split.channels)):
            parts[name] = Slot(c_name(name), (stop - start,) + whole.shape[1:], whole.dtype,
                               "parameter", view_of=whole, offset=start * row_bytes, label=name)
    opt_state = {}
    for name in tm.trainable:
        p = parts.get(name) or state[name]
        opt_state[name] = [
            Slot(c_name(f"{name}.{st}"), p.shape, p.dtype, "optimizer_state",
                 np.zeros(p.shape, p.dtype), label=f"{name}.{st}")
            for st in optimizer.state_names
        ]
    return state, opt_state, parts
