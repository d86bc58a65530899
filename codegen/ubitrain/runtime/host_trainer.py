"""The host trainer: the generated C library loaded with ctypes.

Every batch is checked against the compiled shapes and dtypes before any C runs; every C
status is turned into an exception that says what went wrong.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

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
}
DTYPES = {0: np.float32, 1: np.int64, 2: np.int32, 3: np.int8}


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint32 * 4),
                ("offset", ctypes.c_uint32), ("bytes", ctypes.c_uint32),
                ("trainable", ctypes.c_uint32)]


class _Storage(ctypes.Structure):  # runtime_c/ub_storage.h
    _fields_ = [("user", ctypes.c_void_p), ("block_bytes", ctypes.c_uint32),
                ("read", ctypes.c_void_p), ("write", ctypes.c_void_p)]


class _FileStorage(ctypes.Structure):  # runtime_c/ub_storage_file.h
    _fields_ = [("prefix", ctypes.c_char * 240)]


class _Ctx(ctypes.Structure):
    _fields_ = [("arena", ctypes.c_void_p), ("rng_state", ctypes.c_uint64),
                ("step", ctypes.c_uint32), ("magic", ctypes.c_uint32)]


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


class HostTrainer:
    def __init__(self, library: Path, package, seed: int = 0):
        self.package = package
        self.lib = ctypes.CDLL(str(library))
        m = package.model_name
        self._step = getattr(self.lib, f"ub_{m}_train_step")
        self._predict = getattr(self.lib, f"ub_{m}_predict")
        self._get = getattr(self.lib, f"ub_{m}_get_tensor")
        self._set = getattr(self.lib, f"ub_{m}_set_tensor")
        info = getattr(self.lib, f"ub_{m}_tensor_info_at")
        info.restype = ctypes.POINTER(_TensorInfo)
        for fn in (self._step, self._predict, self._get, self._set):
            fn.restype = ctypes.c_int32
        self.tensors = []
        i = 0
        while info(i):
            t = info(i).contents
            self.tensors.append((t.name.decode(), t.kind, DTYPES[t.dtype],
                                 tuple(t.shape[:t.ndim]), t.bytes))
            i += 1
        align = package.memory_plan.alignment
        self._arena_raw = np.zeros(package.memory_plan.arena_bytes + align, np.uint8)
        start = (-self._arena_raw.ctypes.data) % align
        self.arena = self._arena_raw[start:start + package.memory_plan.arena_bytes]
        self.ctx = _Ctx()
        init = getattr(self.lib, f"ub_{m}_init")
        init.restype = ctypes.c_int32
        self._check(init(ctypes.byref(self.ctx), _ptr(self.arena),
                         ctypes.c_size_t(self.arena.nbytes), ctypes.c_uint64(seed)), "init")

    @property
    def steps(self) -> int:
        return self.ctx.step

    def _check(self, status: int, what: str):
        if status != 0:
            raise RuntimeStatusError(f"{what} returned status {status}: "
                                     f"{STATUS_TEXT.get(status, 'unknown error')}")

    def _inputs(self, xs) -> list[np.ndarray]:
        specs = self.package.inputs
        if len(xs) != len(specs):
            raise InputError(f"the model takes {len(specs)} input tensor(s), got {len(xs)}")
        return [self._as_array(x, spec.shape, spec.dtype, f"input '{spec.name}'")
                for x, spec in zip(xs, specs)]

    @staticmethod
    def _as_array(x, shape, dtype, what) -> np.ndarray:
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        x = np.asarray(x)
        if tuple(x.shape) != tuple(shape):
            raise InputError(f"{what} has shape {list(x.shape)}; the step was compiled for "
                             f"{list(shape)} (recompile for another batch size)")
        want = np.dtype(dtype)
        if want.kind == "f" and x.dtype.kind != "f":
            raise InputError(f"{what} has dtype {x.dtype}; it must be a float array ({dtype})")
        if want.kind in "iu" and x.dtype.kind not in "iu":
            raise InputError(f"{what} has dtype {x.dtype}; it must be an integer array")
        return np.ascontiguousarray(x, dtype=want)

    def step(self, *batch) -> float:
        """`trainer.step(x, y)`: one training step; returns the loss."""
        if len(batch) < 2:
            raise InputError("step() takes the input batch and the labels: step(x, y)")
        xs = self._inputs(batch[:-1])
        labels_spec = self.package.labels
        y = self._as_array(batch[-1], labels_spec.shape, labels_spec.dtype, "labels")
        classes = self.package.classes
        if classes is not None and (y.min() < 0 or y.max() >= classes):
            raise InputError(f"labels must be class indices in [0, {classes}); got values "
                             f"from {y.min()} to {y.max()}")
        loss = np.zeros((), np.float32)
        self._check(self._step(ctypes.byref(self.ctx), *[_ptr(x) for x in xs], _ptr(y),
                               _ptr(loss)), "train_step")
        return float(loss)

    def predict(self, *xs) -> np.ndarray:
        arrays = self._inputs(xs)
        out = np.zeros(self.package.output.shape, np.float32)
        self._check(self._predict(ctypes.byref(self.ctx), *[_ptr(x) for x in arrays],
                                  _ptr(out)), "predict")
        return out

    def _storage(self, path) -> tuple[_FileStorage, _Storage]:
        files, storage = _FileStorage(), _Storage()
        open_storage = self.lib.ub_file_storage_open
        open_storage.restype = ctypes.c_int32
        self._check(open_storage(ctypes.byref(files), ctypes.byref(storage),
                                 str(path).encode()), f"opening storage {path}")
        return files, storage

    def save(self, path) -> None:
        """A crash-safe checkpoint (parameters, buffers, optimizer state, step counter) in
        the files `<path>.0` and `<path>.1`: a save cut short leaves the previous one."""
        files, storage = self._storage(path)
        save = getattr(self.lib, f"ub_{self.package.model_name}_save")
        save.restype = ctypes.c_int32
        self._check(save(ctypes.byref(self.ctx), ctypes.byref(storage)), f"save({path})")

    def restore(self, path) -> None:
        """Restore the last complete checkpoint saved at `path`."""
        files, storage = self._storage(path)
        restore = getattr(self.lib, f"ub_{self.package.model_name}_restore")
        restore.restype = ctypes.c_int32
        self._check(restore(ctypes.byref(self.ctx), ctypes.byref(storage)), f"restore({path})")

    def _read(self, i) -> np.ndarray:
        name, _, dtype, shape, nbytes = self.tensors[i]
        out = np.zeros(shape, dtype)
        self._check(self._get(ctypes.byref(self.ctx), i, _ptr(out), ctypes.c_size_t(nbytes)),
                    f"get_tensor({name})")
        return out

    def parameters(self) -> dict[str, np.ndarray]:
        """Parameters and buffers, by the model's state_dict names."""
        return {t[0]: self._read(i) for i, t in enumerate(self.tensors) if t[1] in (0, 1)}

    def optimizer_state(self) -> dict[str, np.ndarray]:
        return {t[0]: self._read(i) for i, t in enumerate(self.tensors) if t[1] == 2}

    def load_parameters(self, values: dict) -> None:
        by_name = {t[0]: i for i, t in enumerate(self.tensors) if t[1] in (0, 1)}
        unknown = [k for k in values if k not in by_name]
        if unknown:
            raise InputError(f"unknown parameter names {unknown}; known: {list(by_name)}")
        for name, value in values.items():
            i = by_name[name]
            _, _, dtype, shape, nbytes = self.tensors[i]
            arr = self._as_array(value, shape, dtype, f"parameter '{name}'")
            self._check(self._set(ctypes.byref(self.ctx), i, _ptr(arr), ctypes.c_size_t(nbytes)),
                        f"set_tensor({name})")
