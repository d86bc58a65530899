"""The split int8 step trained from Python: the CPU part built for the host and loaded with
ctypes, the DSP part built for hexagon-v66 and run under qemu-hexagon, joined by the pipe
transport (runtime_c/ub_offload_pipe.h) on the emulator's stdin and stdout."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from ..errors import BuildError, CompileError
from ..runtime.build import cmake_build
from ..runtime.host_trainer import HostTrainer
from ..runtime.target_build import missing_tools, toolchain_file
from ..targets import get_target
from .offload import build_dsp


class SplitTrainer(HostTrainer):
    """A host trainer whose DSP segments run in a qemu-hexagon process."""

    def __init__(self, library: Path, package, dsp_binary: Path, seed: int = 0):
        target = get_target("hexagon-v66")
        self.dsp = subprocess.Popen(target.emulator_command(str(dsp_binary)),
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


def start_split_trainer(package, seed: int = 0) -> SplitTrainer:
    target = get_target("hexagon-v66")
    missing = missing_tools(target)
    if missing:
        raise BuildError(f"the DSP part needs {', '.join(missing)}; run scripts/setup.sh")
    out = Path(package.out_dir)
    dsp_binary = build_dsp(out / "dsp", toolchain_file(target))
    build_dir = cmake_build(out, out / "build")
    library = next(build_dir.glob(f"libub_{package.model_name}.so"), None)
    if library is None:
        raise CompileError(f"the build produced no libub_{package.model_name}.so")
    return SplitTrainer(library, package, dsp_binary, seed=seed)
