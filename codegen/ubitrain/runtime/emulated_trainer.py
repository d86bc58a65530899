"""A trainer whose C runs in an emulator (or on a device): the generated driver program.

`pkg.build()` for a cross target starts the model's driver (driver.c, built by the target's
cross compiler) under the target's emulator, once, and keeps it running for the trainer's
life. Every call of the trainer's interface (the same as the host trainer's: step, train,
predict, parameters, load_parameters, optimizer_state) is a request on the driver's input
and a reply on its output (the protocol is written at the top of driver.c). So any number
of steps run in one emulator process: five steps of a test cost one emulator start-up.
`close()` (or leaving a `with` block) ends the process.
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ..errors import RuntimeStatusError
from .checkpoint_files import SlotFiles, slot_prefix
from .trainer_base import DTYPES, TrainerBase, step_count

MAGIC = 0x75627472


class EmulatedTrainer(TrainerBase):
    def __init__(self, command: list[str], package, seed: int = 0, cwd: Path | None = None,
                 timeout: float = 600.0, device_memory: dict | None = None):
        self.package = package
        self.command = command
        self.timeout = timeout  # seconds any one reply may take
        self.device_memory = device_memory or {}
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, cwd=cwd, bufsize=0)
        self._send(b"H")
        magic, count, self.arena_bytes = struct.unpack("<3I", self._recv(12))
        if magic != MAGIC:
            raise RuntimeStatusError(f"the driver under {command[0]} answered with magic "
                                     f"{magic:#x}, not {MAGIC:#x}")
        self.tensors = []
        for _ in range(count):
            (length,) = struct.unpack("<I", self._recv(4))
            name = self._recv(length).decode()
            kind, dtype, ndim, *shape, nbytes = struct.unpack("<8I", self._recv(32))
            self.tensors.append((name, kind, DTYPES[dtype], tuple(shape[:ndim]), nbytes))
        self._send(b"I", struct.pack("<Q", seed))
        self._check(self._status(), "init")

    # ---- the pipe ----------------------------------------------------------------------------
    def _send(self, command: bytes, *payload: bytes):
        data = command.ljust(4, b"\0") + b"".join(payload)
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("accepting a request")

    def _recv(self, n: int) -> bytes:
        chunks, have = [], 0
        deadline = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        while have < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close(kill=True)
                raise RuntimeStatusError(f"the driver under {self.command[0]} sent no reply "
                                         f"within {self.timeout:.0f} s")
            chunk = os.read(fd, n - have)
            if not chunk:
                self._died("replying")
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    def _died(self, doing: str):
        code = self.proc.wait(timeout=10)
        self._stderr.seek(0)
        err = self._stderr.read().decode(errors="replace").strip()[-2000:]
        raise RuntimeStatusError(f"the driver under {self.command[0]} exited with status {code} "
                                 f"while {doing}" + (f":\n{err}" if err else ""))

    def _status(self) -> int:
        return struct.unpack("<i", self._recv(4))[0]

    # ---- the primitives of TrainerBase -------------------------------------------------------
    def _train_step(self, xs, y):
        self._send(b"T", *[x.tobytes() for x in xs], y.tobytes())
        status, loss = struct.unpack("<if", self._recv(8))
        return status, loss

    def _predict(self, xs):
        self._send(b"P", *[x.tobytes() for x in xs])
        status = self._status()
        shape = self.package.output.shape
        out = np.frombuffer(self._recv(4 * int(np.prod(shape))), np.float32).reshape(shape)
        return status, out.copy()

    def _get(self, i):
        self._send(b"G", struct.pack("<I", i))
        status, n = struct.unpack("<iI", self._recv(8))
        name, _, dtype, shape, _ = self.tensors[i]
        data = self._recv(n)
        return status, (np.frombuffer(data, dtype).reshape(shape).copy() if status == 0 else None)

    def _set(self, i, arr: np.ndarray) -> int:
        data = arr.tobytes()
        self._send(b"S", struct.pack("<II", i, len(data)), data)
        return self._status()

    # ---- checkpoints: the driver's storage requests answered from the host's files --------
    def save(self, path) -> None:
        """A crash-safe checkpoint in `<path>.0` and `<path>.1` on the host (missing folders
        made), written by the device's own checkpoint code, as HostTrainer.save."""
        self._checkpoint(b"W", slot_prefix(path, create=True), "save")

    def restore(self, path) -> None:
        """Restore the last complete checkpoint saved at `path` (by any trainer of this
        model and layout: the slot files are the same on every target)."""
        self._checkpoint(b"R", slot_prefix(path, create=False), "restore")

    def _checkpoint(self, command: bytes, prefix: bytes, what: str) -> None:
        files = SlotFiles(prefix)
        self._send(command)
        while True:
            kind, = struct.unpack("<I", self._recv(4))
            if kind == ord("e"):
                status = self._status()
                break
            block, offset, n = struct.unpack("<3I", self._recv(12))
            if kind == ord("w"):
                self._reply(struct.pack("<i", files.write(block, offset, self._recv(n))))
            elif kind == ord("r"):
                got, data = files.read(block, offset, n)
                self._reply(struct.pack("<i", got) + data)
            else:
                self.close(kill=True)
                raise RuntimeStatusError(f"the driver under {self.command[0]} sent storage "
                                         f"request {kind:#x} during {what}")
        self._check(status, f"{what}({os.fsdecode(prefix)!r})")

    def _reply(self, data: bytes):
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("reading a storage reply")

    @property
    def steps(self) -> int:
        self._send(b"C")
        _, step = struct.unpack("<QI", self._recv(12))
        return step

    @steps.setter
    def steps(self, count: int) -> None:
        self._send(b"N", struct.pack("<I", step_count(count)))
        self._check(self._status(), "set the step count")

    # ---- the process -------------------------------------------------------------------------
    def close(self, kill: bool = False):
        proc = getattr(self, "proc", None)
        if proc is None or proc.poll() is not None:
            return
        if not kill:
            try:
                self._send(b"Q")
                proc.wait(timeout=30)
                return
            except (RuntimeStatusError, subprocess.TimeoutExpired):
                pass
        proc.kill()
        proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close(kill=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to report to
            pass
