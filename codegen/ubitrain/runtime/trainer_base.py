"""What every trainer shares, wherever its C runs: the checks of batches, labels and
parameters against the compiled step, the C status texts, and the state_dict view.

A trainer subclass supplies four primitives over the generated C API:
`_train_step(xs, y) -> (status, loss)`, `_predict(xs) -> (status, output)`,
`_get(i) -> (status, ndarray)` and `_set(i, ndarray) -> status`, plus `self.tensors`,
the tensor table (name, kind, dtype, shape, bytes) of `ub_<model>_tensor_info_at`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import InputError, RuntimeStatusError

STATUS_TEXT = {
    -1: "a required pointer is NULL",
    -2: "the arena is too small",
    -3: "the arena is misaligned",
    -4: "the context is not initialised",
    -5: "a class label is outside [0, classes)",
    -6: "the loss is not finite (NaN or inf); no parameter was updated",
    -7: "tensor index out of range",
    -8: "tensor size mismatch",
    -9: "the storage failed to read or write",
    -10: "no complete checkpoint found",
    -11: "the checkpoint belongs to another model or layout",
    -12: "the memory plan pages tensors and no page storage was set (set_storage)",
    -13: "the tensor is frozen and kept in flash (read-only): it takes only the value it "
         "has; compile with it trainable to change it",
    -14: "an embedding id of an input is outside [0, num_embeddings)",
}
DTYPES = {0: np.float32, 1: np.int64, 2: np.int32, 3: np.int8}
PARAMETER, BUFFER, OPTIMIZER_STATE = 0, 1, 2
LABEL_RANGE = -5  # UB_ERR_LABEL_RANGE
INDEX_RANGE = -14  # UB_ERR_INDEX_RANGE
BATCH_HINT = "the batch size is fixed at compile time: recompile for another one"


@functools.lru_cache(maxsize=None)
def step_count(count) -> int:
    """A count of completed steps as the C context holds it (uint32)."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) \
            or not 0 <= count < 2**32:
        raise InputError(f"a step count is an integer in [0, 2^32), got {count!r}")
    return int(count)


def _safe_cast(have: np.dtype, want: np.dtype) -> bool:
    return np.can_cast(have, want)


@functools.lru_cache(maxsize=None)
def _iinfo(dtype: np.dtype):
    return np.iinfo(dtype)


class TrainerBase:
    package = None
    tensors: list = []

    def _check(self, status: int, what: str):
        if status != 0:
            raise RuntimeStatusError(f"{what} returned status {status}: "
                                     f"{STATUS_TEXT.get(status, 'unknown error')}")

    def _inputs(self, xs) -> list[np.ndarray]:
        specs = self.package.inputs
        if len(xs) != len(specs):
            raise InputError(f"the model takes {len(specs)} input tensor(s), got {len(xs)}")
        arrays = [self._as_array(x, spec.shape, spec.dtype, f"input '{spec.name}'", BATCH_HINT)
                  for x, spec in zip(xs, specs)]
        for x, spec in zip(arrays, specs):  # PyTorch raises IndexError for these
            bound = spec.index_bound
            if bound is not None and x.size and (x.min() < 0 or x.max() >= bound):
                raise InputError(f"input '{spec.name}' holds embedding ids from {x.min()} to "
                                 f"{x.max()}; they must lie in [0, {bound}) (num_embeddings)")
        return arrays

    @staticmethod
    def _as_array(x, shape, dtype, what, hint: str = "") -> np.ndarray:
        """`x` as a C-contiguous array of the compiled `shape` and `dtype`; an integer array
        whose values the cast would wrap (2**32 + 3 as an int32 is 3) is refused, not cast."""
        if type(x) is not np.ndarray:
            if hasattr(x, "detach"):  # a torch tensor
                x = x.detach() if x.requires_grad else x
                x = (x if x.device.type == "cpu" else x.cpu()).numpy()
            else:
                x = np.asarray(x)
        want = np.dtype(dtype)
        if x.shape != tuple(shape):
            raise InputError(f"{what} has shape {list(x.shape)}; it must be {list(shape)}"
                             + (f" ({hint})" if hint else ""))
        if x.dtype == want:
            return x if x.flags.c_contiguous else np.ascontiguousarray(x)
        if want.kind == "f" and x.dtype.kind != "f":
            raise InputError(f"{what} has dtype {x.dtype}; it must be a float array "
                             f"({want.name})")
        if want.kind in "iu":
            if x.dtype.kind not in "iu":
                raise InputError(f"{what} has dtype {x.dtype}; it must be an integer array "
                                 f"({want.name})")
            if x.size and not _safe_cast(x.dtype, want):
                info, low, high = _iinfo(want), x.min(), x.max()
                if low < info.min or high > info.max:
                    raise InputError(f"{what} holds values from {low} to {high}, outside "
                                     f"{want.name}'s range [{info.min}, {info.max}]")
        return np.ascontiguousarray(x, dtype=want)

    def _batch(self, batch, classes: bool = False) -> tuple[list[np.ndarray], np.ndarray]:
        """`(x..., y)` checked against the compiled shapes and dtypes, and with `classes`
        against the class count (which the C step checks on its own, UB_ERR_LABEL_RANGE)."""
        if len(batch) < 2:
            raise InputError("step() takes the input batch and the labels: step(x, y)")
        xs = self._inputs(batch[:-1])
        labels_spec = self.package.labels
        y = self._as_array(batch[-1], labels_spec.shape, labels_spec.dtype, "labels",
                           BATCH_HINT)
        classes = self.package.classes if classes else None
        if classes is not None and (y.min() < 0 or y.max() >= classes):
            raise InputError(f"labels must be class indices in [0, {classes}); got values "
                             f"from {y.min()} to {y.max()}")
        return xs, y

    # ---- the public interface ---------------------------------------------------------------
    def _ready(self, batch):
        """`(xs, y)` as they are when every array of `batch` is a C-contiguous numpy array of
        the compiled shape and dtype, else None. The C checks the class labels itself
        (UB_ERR_LABEL_RANGE) and embedding ids (UB_ERR_INDEX_RANGE), so a batch in the
        compiled layout needs no other check."""
        specs = self._layout
        if len(batch) != len(specs):
            return None
        for a, (shape, dtype) in zip(batch, specs):
            if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or \
                    not a.flags.c_contiguous:
                return None
        return batch[:-1], batch[-1]

    @functools.cached_property
    def _layout(self) -> list[tuple]:
        return [(tuple(s.shape), np.dtype(s.dtype))
                for s in [*self.package.inputs, self.package.labels]]

    def step(self, *batch) -> float:
        """`trainer.step(x, y)`: one training step; returns the loss."""
        xs, y = self._ready(batch) or self._batch(batch)
        status, loss = self._train_step(xs, y)
        if status in (LABEL_RANGE, INDEX_RANGE):
            self._batch(batch, classes=True)  # says which labels or ids are out of range
        self._check(status, "train_step")
        return float(loss)

    def train(self, batches) -> np.ndarray:
        """One step per `(x, y)` (or `(x1, x2, ..., y)`) of `batches`; the losses."""
        return np.array([self.step(*b) for b in batches], np.float32)

    def predict(self, *xs) -> np.ndarray:
        """Forward pass in evaluation mode on one batch."""
        status, out = self._predict(self._inputs(xs))
        self._check(status, "predict")
        return out

    def _read(self, i) -> np.ndarray:
        status, out = self._get(i)
        self._check(status, f"get_tensor({self.tensors[i][0]})")
        return out

    @property
    def _aliases(self) -> dict[str, str]:
        """{other name: tensor table name} of the tensors tied in the model."""
        return getattr(self.package, "aliases", None) or {}

    def parameters(self) -> dict[str, np.ndarray]:
        """Parameters and buffers, by the model's state_dict names: a tied tensor under each
        of its names, as one array (as PyTorch's state_dict lists one tensor)."""
        out = {t[0]: self._read(i) for i, t in enumerate(self.tensors)
               if t[1] in (PARAMETER, BUFFER)}
        out.update({alias: out[name] for alias, name in self._aliases.items()})
        return out

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {t[0]: self._read(i) for i, t in enumerate(self.tensors)
                if t[1] == OPTIMIZER_STATE}

    def reset_optimizer_state(self) -> None:
        """Zero every optimizer-state tensor (SGD's momentum buffers): the next step starts
        as a fresh SGD optimizer's first step would (with dampening 0). A federated client
        does this at each round."""
        for i, t in enumerate(self.tensors):
            if t[1] == OPTIMIZER_STATE:
                self._check(self._set(i, np.zeros(t[3], t[2])), f"set_tensor({t[0]})")

    def _check_finite(self, i: int, arr: np.ndarray, what: str) -> None:
        """Refuse a NaN or inf that the tensor does not already hold at that place: one
        would make every later step's loss NaN. (An attention mask's -inf buffer, loaded back
        from the trainer's own parameters(), is the value it has.)"""
        if arr.dtype.kind != "f":
            return
        bad = ~np.isfinite(arr)
        if bad.any():
            bad &= arr != self._read(i)
        if bad.any():
            first = tuple(int(j) for j in np.argwhere(bad)[0])
            raise InputError(f"{what} holds {int(bad.sum())} value(s) that are not finite "
                             f"({arr[first]} at {list(first)}); load finite values")

    def load_optimizer_state(self, values: dict) -> None:
        """Optimizer-state tensors by name, as optimizer_state() gives them: all checked
        first, then written."""
        by_name = {t[0]: i for i, t in enumerate(self.tensors) if t[1] == OPTIMIZER_STATE}
        unknown = [k for k in values if k not in by_name]
        if unknown:
            raise InputError(f"unknown optimizer state names {unknown}; known: {list(by_name)}")
        checked = [(k, by_name[k], self._as_array(v, self.tensors[by_name[k]][3],
                                                  self.tensors[by_name[k]][2],
                                                  f"optimizer state '{k}'"))
                   for k, v in values.items()]
        for name, i, arr in checked:
            self._check_finite(i, arr, f"optimizer state '{name}'")
        for name, i, arr in checked:
            self._check(self._set(i, arr), f"set_tensor({name})")

    def load_parameters(self, values: dict) -> None:
        """Every tensor of `values` checked first, then all written: a bad entry leaves the
        trainer as it was."""
        by_name = {t[0]: i for i, t in enumerate(self.tensors) if t[1] in (PARAMETER, BUFFER)}
        if not isinstance(values, dict):
            raise InputError(f"load_parameters takes a dict name -> array, got "
                             f"{type(values).__name__}")
        aliases = self._aliases
        unknown = [k for k in values if aliases.get(k, k) not in by_name]
        if unknown:
            raise InputError(f"unknown parameter names {unknown}; known: "
                             f"{list(by_name) + list(aliases)}")
        checked = {}
        for key, value in values.items():
            name = aliases.get(key, key)  # a tied tensor's other name: its one tensor
            i = by_name[name]
            _, _, dtype, shape, _ = self.tensors[i]
            arr = self._as_array(value, shape, dtype, f"parameter '{key}'")
            self._check_finite(i, arr, f"parameter '{key}'")
            if name in checked and not np.array_equal(arr, checked[name][2]):
                raise InputError(f"parameters '{checked[name][0]}' and '{key}' are one tensor "
                                 "tied in the model, and the values given differ; give one of "
                                 "them, or the same value under both")
            if name in self.package.frozen_in_flash and not np.array_equal(arr, self._read(i)):
                raise InputError(f"parameter '{key}' is frozen and kept in flash (read-only): "
                                 "it takes only the value it has; compile with it trainable "
                                 "to change it")
            checked.setdefault(name, (key, i, arr))
        for name, i, arr in checked.values():
            self._check(self._set(i, arr), f"set_tensor({name})")
