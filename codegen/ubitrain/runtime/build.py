"""Build a generated C project with CMake, the way a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import BuildError
from ..progress import Steps


def cmake_build(project_dir: Path, build_dir: Path, shared: bool = True,
                extra_args: tuple[str, ...] = (), toolchain: Path | None = None,
                progress: bool | None = None) -> Path:
    """Configure and build; `toolchain`: a CMake toolchain file for a cross compiler."""
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not installed; install it (apt-get install cmake) to build "
                         "the generated project")
    configure = ["cmake", "-S", str(project_dir), "-B", str(build_dir),
                 f"-DBUILD_SHARED_LIBS={'ON' if shared else 'OFF'}", *extra_args]
    if toolchain is not None:
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={Path(toolchain).resolve()}")
    steps = {"cmake configure": configure,
             "compile C": ["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)]}
    with Steps(f"ubitrain build {Path(project_dir).name}", list(steps), progress) as step:
        for name, cmd in steps.items():
            step(name)
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                log = (result.stdout + result.stderr)[-4000:]
                raise BuildError(f"building the generated C failed ({' '.join(cmd[:2])}):"
                                 f"\n{log}")
    return build_dir
