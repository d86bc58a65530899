"""`ubitrain build`: a generated project built with CMake, for the host or a cross target."""

from __future__ import annotations

import re
from pathlib import Path

from .common import formatter, progress

BUILD_HELP = """\
Build a project that ubitrain compile wrote, with CMake: for the host with the system C
compiler (a shared library), or for a cross target with its toolchain file
from targets/ (the static library and the driver program that runs under the emulator).
This is what `cmake -S PROJECT -B BUILD_DIR && cmake --build BUILD_DIR` does; no Python is
needed to build the project on a machine of your own."""

BUILD_EPILOG = """\
examples:
  ubitrain compile examples/digits_factory.py:factory --out-dir build/digits
  ubitrain build build/digits
  ubitrain compile examples/digits_factory.py:factory --target cortex-m4 --out-dir build/m4
  ubitrain build build/m4 --target cortex-m4"""

def add_parser(sub):
    b = sub.add_parser("build", help="build a generated C project with CMake",
                       description=BUILD_HELP, epilog=BUILD_EPILOG, formatter_class=formatter)
    b.add_argument("project", help="the directory ubitrain compile wrote (its --out-dir)")
    b.add_argument("--target", default="host",
                   help="host (the system compiler) or a cross target from ubitrain targets")
    b.add_argument("--build-dir", help="where CMake builds (default PROJECT/build-TARGET)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from ..errors import BuildError
    from ..runtime.build import cmake_build
    from ..targets import get_target

    target = get_target(args.target)
    project = Path(args.project)
    if not (project / "CMakeLists.txt").is_file():
        raise BuildError(f"{project} holds no generated project (no CMakeLists.txt); write one "
                         "with ubitrain compile --out-dir first")
    compiled_for = _compiled_target(project)
    if compiled_for not in (None, target.name):
        raise BuildError(f"{project} was compiled for {compiled_for}, not {target.name} (its "
                         f"kernels and memory plan are {compiled_for}'s): build it with "
                         f"--target {compiled_for}, or compile the model again with --target "
                         f"{target.name}")
    build_dir = Path(args.build_dir or project / f"build-{target.name}")
    if target.runs_on_host:
        cmake_build(project, build_dir, progress=progress(args))
    else:
        from ..runtime.target_build import build_driver

        header = (project / "model.h").read_text()
        model = re.search(r"int32_t ub_(\w+)_init\(", header).group(1)
        print(f"driver: {build_driver(project, model, target, progress(args))}")
    print(f"built {project} for {target.name} in {build_dir}:")
    for artifact in sorted(build_dir.glob("libub_*")) + sorted(build_dir.glob("ub_*_driver")):
        print(f"  {artifact}")
    return 0


def _compiled_target(project: Path) -> str | None:
    """The target the project was compiled for (package.json), if it says."""
    import json

    try:
        return json.loads((project / "package.json").read_text()).get("target")
    except (OSError, ValueError, AttributeError):
        return None
