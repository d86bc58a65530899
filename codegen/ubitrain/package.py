"""A compiled model: the C project in `out_dir` and what is known about it."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CompileError
from .memory.plan import MemoryPlan
from .program.ir import Program, Slot
from .runtime.build import cmake_build
from .runtime.host_trainer import HostTrainer
from .targets import Target


@dataclass
class Package:
    out_dir: Path
    model_name: str
    target: Target
    memory_plan: MemoryPlan
    inputs: list[Slot]
    labels: Slot
    output: Slot
    classes: int | None
    trainable: list[str]
    programs: dict[str, Program] = field(repr=False, default_factory=dict)
    kernel_count: int = 0
    compile_seconds: float = 0.0
    frozen_in_flash: list[str] = field(default_factory=list)  # state kept as const data
    aliases: dict[str, str] = field(default_factory=dict)  # tied tensor's name -> its slot's
    precision: str = "fp32"
    # rewrite passes that did not run, and why (switched off, or a precondition that fails)
    skipped_passes: dict[str, str] = field(default_factory=dict)
    pages: int = 0  # tensors the step pages out to storage under a memory budget
    manifest: dict | None = field(default=None, repr=False)  # package.json, when loaded

    def build(self, seed: int = 0, progress: bool | None = None,
              arena_fill: int = 0) -> HostTrainer:
        """Build the C project with CMake and load it (host target), or cross-compile it
        and start its driver under the target's emulator (runtime/emulated_trainer.py).
        `arena_fill`: the byte the host arena starts as (0xFF: NaN, to catch a read of
        memory that nothing wrote)."""
        if not self.target.runs_on_host:
            from .runtime.target_build import start_trainer
            return start_trainer(self, self.target, seed=seed, progress=progress)
        build_dir = cmake_build(self.out_dir, self.out_dir / "build", progress=progress)
        library = next(build_dir.glob(f"libub_{self.model_name}.so"), None)
        if library is None:
            raise CompileError(f"the build produced no libub_{self.model_name}.so in {build_dir}")
        return HostTrainer(loadable_copy(library), self, seed=seed, arena_fill=arena_fill)


def loadable_copy(library: Path) -> Path:
    """A copy of `library` named after its content. The dynamic loader hands out the library
    a process already loaded from a path again, so a model recompiled into the same out_dir
    would run its old code with the new package's shapes; a new build has a new name."""
    digest = hashlib.sha256(library.read_bytes()).hexdigest()[:16]
    copy = library.with_name(f"{library.stem}-{digest}{library.suffix}")
    if not copy.exists():
        for stale in library.parent.glob(f"{library.stem}-*{library.suffix}"):
            stale.unlink()  # a process that loaded it keeps its mapping
        shutil.copyfile(library, copy)
    return copy
