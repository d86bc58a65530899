"""The host trainer: the generated C library loaded with ctypes.

Every batch is checked against the compiled shapes and dtypes before any C runs; every C
status is turned into an exception that says what went wrong.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np

from .checkpoint_files import slot_prefix
from .trainer_base import DTYPES, STATUS_TEXT, TrainerBase, step_count  # noqa: F401 (re-exported)


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.c_uint32 * 4),
                ("offset", ctypes.c_uint32), ("bytes", ctypes.c_uint32),
                ("trainable", ctypes.c_uint32), ("flash", ctypes.c_void_p)]


class _Storage(ctypes.Structure):  # runtime_c/ub_storage.h
    _fields_ = [("user", ctypes.c_void_p), ("block_bytes", ctypes.c_uint32),
                ("read", ctypes.c_void_p), ("write", ctypes.c_void_p)]


PREFIX_BYTES = 1024  # runtime_c/ub_storage_file.h UB_FILE_STORAGE_PREFIX_BYTES


class _FileStorage(ctypes.Structure):  # runtime_c/ub_storage_file.h
    _fields_ = [("prefix", ctypes.c_char * PREFIX_BYTES), ("durable", ctypes.c_int32)]


class _Ctx(ctypes.Structure):
    _fields_ = [("arena", ctypes.c_void_p), ("rng_state", ctypes.c_uint64),
                ("step", ctypes.c_uint32), ("magic", ctypes.c_uint32),
                ("page_storage", ctypes.c_void_p)]


def _ptr(a: np.ndarray):
    # the address alone: data_as() also builds an object that keeps `a` alive, several
    # microseconds a call; every array passed here outlives the call it is passed to.
    # A writable array's address through the buffer protocol costs a third of a.ctypes.
    if a.flags.writeable:
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(a)))
    return ctypes.c_void_p(a.ctypes.data)


class HostTrainer(TrainerBase):
    def __init__(self, library: Path, package, seed: int = 0, arena_fill: int = 0):
        self.package = package
        self.library = Path(library)  # another trainer of the same build can load it too
        self.lib = ctypes.CDLL(str(library))
        m = package.model_name
        self._step = getattr(self.lib, f"ub_{m}_train_step")
        self._predict_fn = getattr(self.lib, f"ub_{m}_predict")
        self._get_fn = getattr(self.lib, f"ub_{m}_get_tensor")
        self._set_fn = getattr(self.lib, f"ub_{m}_set_tensor")
        info = getattr(self.lib, f"ub_{m}_tensor_info_at")
        info.restype = ctypes.POINTER(_TensorInfo)
        for fn in (self._step, self._predict_fn, self._get_fn, self._set_fn):
            fn.restype = ctypes.c_int32
        self.tensors = []
        i = 0
        while info(i):
            t = info(i).contents
            self.tensors.append((t.name.decode(), t.kind, DTYPES[t.dtype],
                                 tuple(t.shape[:t.ndim]), t.bytes))
            i += 1
        align = package.memory_plan.alignment
        # arena_fill = 0xFF makes every byte that init does not write a NaN: a step that
        # reads memory before writing it then shows (tests and the fuzzer use it)
        self._arena_raw = np.full(package.memory_plan.arena_bytes + align, arena_fill, np.uint8)
        start = (-self._arena_raw.ctypes.data) % align
        self.arena = self._arena_raw[start:start + package.memory_plan.arena_bytes]
        self.ctx = _Ctx()
        self._loss = np.zeros((), np.float32)  # step() reads each loss from here
        self._loss_ptr = _ptr(self._loss)
        init = getattr(self.lib, f"ub_{m}_init")
        init.restype = ctypes.c_int32
        self._check(init(ctypes.byref(self.ctx), _ptr(self.arena),
                         ctypes.c_size_t(self.arena.nbytes), ctypes.c_uint64(seed)), "init")
        self._pages = None
        if package.pages:  # the step pages tensors out to storage
            self._set_page_storage()

    def _set_page_storage(self):
        """The plan pages tensors: give the step file-backed storage in a temp directory
        (removed with the trainer)."""
        import tempfile

        self._pages = tempfile.TemporaryDirectory(prefix="ub_pages_")
        self._page_storage = self._storage(Path(self._pages.name) / "page")
        self._page_storage[0].durable = 0  # scratch: no fsync per page
        set_storage = getattr(self.lib, f"ub_{self.package.model_name}_set_storage")
        set_storage.restype = ctypes.c_int32
        self._check(set_storage(ctypes.byref(self.ctx), ctypes.byref(self._page_storage[1])),
                    "set_storage")

    @property
    def steps(self) -> int:
        return self.ctx.step

    @steps.setter
    def steps(self, count: int) -> None:
        """Set the count of completed steps (the schedules that depend on it go on from
        there)."""
        self.ctx.step = step_count(count)

    @property
    def rng_state(self) -> int:
        """The Dropout generator's state (SplitMix64), where the next step's masks start."""
        return self.ctx.rng_state

    def _step_args(self, xs, y, loss) -> tuple:
        return (ctypes.byref(self.ctx), *[_ptr(x) for x in xs], _ptr(y), _ptr(loss))

    def _train_step(self, xs, y):
        status = self._step(ctypes.byref(self.ctx), *[_ptr(x) for x in xs], _ptr(y),
                            self._loss_ptr)
        return status, float(self._loss)

    def bound_step(self, *batch):
        """A function of no arguments that runs one training step on `batch` (checked and
        converted once, here) and returns the C status: the generated step as a C program's
        loop calls it, without step()'s per-call checks (benchmarks/speed.py times it)."""
        xs, y = self._batch(batch, classes=True)
        loss = np.zeros((), np.float32)
        step = functools.partial(self._step, *self._step_args(xs, y, loss))
        # The arguments are bare addresses: keep alive what they point to, the trainer's
        # arena and library included, for as long as the step may be called.
        step.keep_alive = (self, xs, y, loss)
        return step

    def _predict(self, xs):
        out = np.zeros(self.package.output.shape, np.float32)
        return self._predict_fn(ctypes.byref(self.ctx), *[_ptr(x) for x in xs], _ptr(out)), out

    def _storage(self, path, create: bool = False) -> tuple[_FileStorage, _Storage]:
        """The C file storage over `<path>.0` and `<path>.1`; `create`: its folder made
        first if it is missing."""
        prefix = slot_prefix(path, create, PREFIX_BYTES - 12)  # ".<block>" and a zero
        files, storage = _FileStorage(), _Storage()
        open_storage = self.lib.ub_file_storage_open
        open_storage.restype = ctypes.c_int32
        self._check(open_storage(ctypes.byref(files), ctypes.byref(storage), prefix),
                    f"opening storage {os.fsdecode(prefix)!r}")
        return files, storage

    def save(self, path) -> None:
        """A crash-safe checkpoint (parameters, buffers, optimizer state, step counter, the
        Dropout generator) in the files `<path>.0` and `<path>.1` (missing folders made): a
        save cut short leaves the previous one, and a save that returned is on disk (fsync)."""
        files, storage = self._storage(path, create=True)
        save = getattr(self.lib, f"ub_{self.package.model_name}_save")
        save.restype = ctypes.c_int32
        self._check(save(ctypes.byref(self.ctx), ctypes.byref(storage)),
                    f"save({os.fsdecode(os.fspath(path))!r})")

    def restore(self, path) -> None:
        """Restore the last complete checkpoint saved at `path`; unless it succeeds, the
        trainer stays exactly as it was."""
        files, storage = self._storage(path)
        restore = getattr(self.lib, f"ub_{self.package.model_name}_restore")
        restore.restype = ctypes.c_int32
        state_bytes = self.package.memory_plan.persistent_bytes
        # The C restore stages through the step's working memory where it fits
        # (MemoryPlan.restore_is_atomic); here, host memory makes every restore all or nothing.
        before = (self.arena[:state_bytes].copy(), self.ctx.step, self.ctx.rng_state)
        status = restore(ctypes.byref(self.ctx), ctypes.byref(storage))
        if status != 0:
            self.arena[:state_bytes], self.ctx.step, self.ctx.rng_state = before
        self._check(status, f"restore({os.fsdecode(os.fspath(path))!r})")

    def _get(self, i):
        name, _, dtype, shape, nbytes = self.tensors[i]
        out = np.zeros(shape, dtype)
        return self._get_fn(ctypes.byref(self.ctx), i, _ptr(out), ctypes.c_size_t(nbytes)), out

    def _set(self, i, arr: np.ndarray) -> int:
        return self._set_fn(ctypes.byref(self.ctx), i, _ptr(arr), ctypes.c_size_t(arr.nbytes))

