"""The split int8 step trained from Python: the DSP part built for hexagon-v66 and run under
qemu-hexagon, joined by the pipe transport (runtime_c/ub_offload_pipe.h) to the CPU part,
which is either built for the host and loaded with ctypes (SplitTrainer) or built for the
Android CPU and run as a driver program under qemu-aarch64 (EmulatedSplitTrainer, the two
emulators joined by two FIFOs)."""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError, CompileError
from ..runtime.build import cmake_build
from ..runtime.emulated_trainer import EmulatedTrainer
from ..runtime.host_trainer import HostTrainer
from ..runtime.target_build import missing_tools, toolchain_file
from ..targets import get_target
from .split import build_dsp


class SplitTrainer(HostTrainer):
    """A host trainer whose DSP segments run in a qemu-hexagon process."""

    def __init__(self, library: Path, package, dsp_binary: Path, seed: int = 0):
        self.dsp = subprocess.Popen(package.target.emulator_command(str(dsp_binary)),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        super().__init__(library, package, seed=seed)
        connect = getattr(self.lib, f"ub_{package.model_name}_offload_pipe")
        connect.restype = ctypes.c_int32
        self._check(connect(self.dsp.stdin.fileno(), self.dsp.stdout.fileno()), "offload_pipe")

    def close(self):
        dsp = getattr(self, "dsp", None)
        if dsp is not None and dsp.poll() is None:
            try:
                dsp.stdin.write(b"\xff\xff\xff\xff\0\0\0\0")  # method 0xFFFFFFFF: quit
                dsp.stdin.flush()
                dsp.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                dsp.kill()
                dsp.wait()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class EmulatedSplitTrainer(EmulatedTrainer):
    """The CPU part's driver under its emulator, its DSP segments in a qemu-hexagon process
    reading requests from one FIFO and replying on another (in `fifo_dir`, removed on close).
    The DSP part ends when the CPU part exits (end of its requests)."""

    def __init__(self, command, package, dsp: subprocess.Popen, fifo_dir: str, **kwargs):
        self.dsp, self.fifo_dir = dsp, fifo_dir
        super().__init__(command, package, **kwargs)

    def close(self, kill: bool = False):
        super().close(kill=kill)
        dsp = getattr(self, "dsp", None)
        if dsp is not None and dsp.poll() is None:
            try:
                dsp.wait(timeout=0 if kill else 30)
            except subprocess.TimeoutExpired:
                dsp.kill()
                dsp.wait()
        shutil.rmtree(getattr(self, "fifo_dir", ""), ignore_errors=True)


def build_emulated_split(package) -> tuple:
    """(CPU target, CPU part's driver program, DSP part's program) of a split package whose
    CPU part runs under an emulator."""
    cpu, dsp_target = get_target(package.config.cpu_target), package.target
    missing = missing_tools(cpu) + missing_tools(dsp_target)
    if missing:
        raise BuildError(f"the split step under emulators needs {', '.join(missing)}; run "
                         "scripts/setup.sh")
    out = Path(package.out_dir)
    dsp_binary = build_dsp(out / "dsp", toolchain_file(dsp_target, out))
    build = cmake_build(out / "offload_cpu", out / "offload_cpu" / f"build-{cpu.name}",
                        shared=False, toolchain=toolchain_file(cpu))
    binary = build / f"ub_{package.model_name}_offload_driver"
    if not binary.is_file():
        raise BuildError(f"the build produced no {binary.name} in {build}")
    return cpu, binary.resolve(), dsp_binary.resolve()


def start_dsp(dsp, dsp_binary: Path, emulator_flags: tuple[str, ...] = (), **popen) -> tuple:
    """The DSP part (`dsp`: its Target) under its emulator on two new FIFOs: (process, FIFO
    directory, the FIFO to the DSP, the FIFO from it). The shell, not this process, blocks
    opening the FIFOs until the CPU part opens its ends."""
    fifo_dir = tempfile.mkdtemp(prefix="ub_offload_")
    to_dsp, from_dsp = os.path.join(fifo_dir, "to_dsp"), os.path.join(fifo_dir, "from_dsp")
    os.mkfifo(to_dsp)
    os.mkfifo(from_dsp)
    cmd = dsp.emulator_command(str(dsp_binary))
    cmd = shlex.join([cmd[0], *emulator_flags, *cmd[1:]])
    dsp = subprocess.Popen(["sh", "-c", f"exec {cmd} <{shlex.quote(to_dsp)} "
                                        f">{shlex.quote(from_dsp)}"], **popen)
    return dsp, fifo_dir, to_dsp, from_dsp


def start_emulated_split_trainer(package, seed: int = 0) -> EmulatedSplitTrainer:
    cpu, binary, dsp_binary = build_emulated_split(package)
    dsp, fifo_dir, to_dsp, from_dsp = start_dsp(package.target, dsp_binary)
    timeout = float(os.environ.get("UBITRAIN_EMULATOR_TIMEOUT", "600"))
    return EmulatedSplitTrainer(cpu.emulator_command(str(binary)) + [to_dsp, from_dsp],
                                package, dsp, fifo_dir, seed=seed, cwd=binary.parent,
                                timeout=timeout)


def start_split_trainer(package, seed: int = 0):
    if package.config.cpu_target != "host":
        return start_emulated_split_trainer(package, seed)
    missing = missing_tools(package.target)
    if missing:
        raise BuildError(f"the DSP part needs {', '.join(missing)}; run scripts/setup.sh")
    out = Path(package.out_dir)
    dsp_binary = build_dsp(out / "dsp", toolchain_file(package.target, out))
    build_dir = cmake_build(out, out / "build")
    library = next(build_dir.glob(f"libub_{package.model_name}.so"), None)
    if library is None:
        raise CompileError(f"the build produced no libub_{package.model_name}.so")
    return SplitTrainer(library, package, dsp_binary, seed=seed)
