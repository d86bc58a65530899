"""The int8 step split between a CPU part and a DSP part (hexagon-v66), joined by the offload
interface of runtime_c (ub_offload.h).

Each maximal run of consecutive kernels that the placement (placement.py) puts on the DSP
becomes one method of the DSP part: the CPU part's step calls `ub_dsp_segment_<k>`, which
invokes method k with every tensor the run touches (in: all of them; out: those it writes),
and the DSP part runs the same kernels (portable C, built for the DSP) on its own copy of
the arena at the same offsets: both parts are generated from one memory plan, so the DSP's
graph is prepared at compile time and each step only executes it. The CPU part's copy of
the arena stays the master copy, so the split step computes exactly what the all-CPU step
computes.

The CPU part runs in this process (NITI(cpu_target="host")) or as a program under the
Android CPU's emulator (cpu_target="aarch64-neon", render_cpu_driver), the DSP part always
under qemu-hexagon; the two talk over pipes.

The CPU part submits each segment and waits for it as late as the data allow (overlap.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jinja2

from ..errors import BuildError, CompileError
from ..kernels.c_printer import c_type
from ..program.ir import Call, Program
from ..project.emit import CallPrinter, c_array
from ..runtime.build import cmake_build
from . import overlap

RUNTIME_C = Path(__file__).resolve().parent.parent / "runtime_c"
ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                         undefined=jinja2.StrictUndefined)
DSP_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(ub_dsp C)
set(CMAKE_C_STANDARD 99)
add_executable(ub_dsp dsp_main.c ${UB_TARGET_SOURCES})
target_include_directories(ub_dsp PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime_c)
target_include_directories(ub_dsp PRIVATE ${UB_TARGET_INCLUDES})
target_compile_options(ub_dsp PRIVATE -O2 -Wall -Wno-unused-function)
"""


@dataclass
class Segment:
    method: int
    calls: list = field(default_factory=list)  # indices into the train program
    roots: list = field(default_factory=list)
    written: set = field(default_factory=set)  # ids of roots a call of the run writes

    def buffers(self, plan) -> list[dict]:
        return [dict(ctype=c_type(r.dtype), bytes=r.nbytes, offset=plan.offsets[r],
                     flags=1 | (2 if id(r) in self.written else 0)) for r in self.roots]


def segments_of(train: Program, placed) -> list[Segment]:
    segments: list[Segment] = []
    previous = "cpu"
    for k, (call, p) in enumerate(zip(train.calls, placed)):
        if p.where != "dsp":
            previous = "cpu"
            continue
        if previous != "dsp":
            segments.append(Segment(len(segments)))
        seg = segments[-1]
        seg.calls.append(k)
        for s in call.args:
            r = s.root
            if r.kind == "constant":  # compiled into the DSP part (dsp_part)
                continue
            if r.external:
                raise CompileError(f"kernel {call.kernel} reads the caller's {r.name}; it "
                                   "cannot run on the DSP")
            if all(r is not x for x in seg.roots):
                seg.roots.append(r)
        seg.written.update(id(s.root) for s in call.writes)
        previous = "dsp"
    return segments


def split_program(train: Program, segments: list[Segment]) -> Program:
    """The CPU part: each DSP run replaced by one call of its segment."""
    first = {seg.calls[0]: seg for seg in segments}
    inside = {k for seg in segments for k in seg.calls}
    calls = []
    for k, call in enumerate(train.calls):
        if k in first:
            seg = first[k]
            calls.append(Call(f"ub_dsp_segment_{seg.method}", list(seg.roots),
                              list(range(len(seg.roots)))))
        elif k not in inside:
            calls.append(call)
    return Program(train.name, calls)


def cpu_source(model_name: str, segments: list[Segment], plan, overlaps) -> str:
    during = {ov.method: ov.kernels for ov in overlaps}
    return ENV.get_template("offload.c.j2").render(
        variant="cpu", m=model_name,
        segments=[dict(method=s.method, buffers=s.buffers(plan), overlap=during[s.method])
                  for s in segments])


def dsp_part(train: Program, placement, plan, library) -> tuple[Callable, list[str]]:
    """The DSP part of a step whose kernels are portable C: (the C statement of
    train call k on the DSP, the DSP part's sources: the constants its calls read, the
    library's shared code and the kernels)."""
    on_dsp = [c for c, p in zip(train.calls, placement) if p.where == "dsp"]
    constants = {id(a.root): a.root for c in on_dsp for a in c.args
                 if a.root.kind == "constant"}
    names = {key: f"ub_const_dsp_{i}" for i, key in enumerate(constants)}
    sources = [f"static const {c_type(r.dtype)} {names[key]}[{max(r.value.size, 1)}] = "
               f"{c_array(r.value)};" for key, r in constants.items()]
    sources += list(library.support.values()) + library.sources({c.kernel for c in on_dsp})
    printer = CallPrinter(plan, names, {}, library.unread_arguments())
    return (lambda k: printer.statement(train.calls[k])), sources


def render_dsp(out_dir: Path, model_name: str, statement: Callable, dsp_sources: list[str],
               segments: list[Segment], plan) -> Path:
    """The DSP part's project in out_dir/dsp: `dsp_sources` (its kernels) and each segment's
    calls, `statement(k)` being the C of the step's call k, on the plan's arena."""
    segs = [dict(method=seg.method, buffers=seg.buffers(plan),
                 body=[statement(k) for k in seg.calls]) for seg in segments]
    dsp = out_dir / "dsp"
    (dsp / "runtime_c").mkdir(parents=True, exist_ok=True)
    for name in ("ub_runtime.h", "ub_math.h", "ub_status.h"):
        shutil.copy(RUNTIME_C / name, dsp / "runtime_c" / name)
    source = ENV.get_template("offload.c.j2").render(
        variant="dsp", m=model_name, kernels=dsp_sources, segments=segs,
        arena_bytes=plan.arena_bytes, alignment=plan.alignment,
        max_buffers=max((len(s["buffers"]) for s in segs), default=1))
    (dsp / "dsp_main.c").write_text(source)
    (dsp / "CMakeLists.txt").write_text(DSP_CMAKE)
    return dsp


@dataclass
class DspSplit:
    segments: list[Segment]
    overlaps: list  # overlap.py Overlap per segment
    cpu_part: Program  # the step the CPU runs: DSP segments submitted and waited for
    cpu_source: str  # the C of those submits and waits


def split_step(out_dir: Path, model_name: str, train: Program, placement, plan,
               library) -> DspSplit:
    """`train` cut at the runs the placement puts on the DSP: the DSP part's project
    (render_dsp), the CPU part's driver for an emulator (render_cpu_driver) and the CPU
    part, which submits each run as early and waits for it as late as the data allow."""
    segments = segments_of(train, placement)
    cpu = split_program(train, segments)
    overlaps = overlap.schedule(cpu, segments, plan)
    render_dsp(out_dir, model_name, *dsp_part(train, placement, plan, library), segments, plan)
    render_cpu_driver(out_dir, model_name)
    return DspSplit(segments, overlaps, overlap.apply(cpu, segments, plan),
                    cpu_source(model_name, segments, plan, overlaps))


CPU_DRIVER_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(ub_offload_cpu C)
set(CMAKE_C_STANDARD 99)
# the model's library from the project one level up, its driver.c with main renamed
add_subdirectory(${{CMAKE_CURRENT_SOURCE_DIR}}/.. model)
set(UB_DRIVER_C ${{CMAKE_CURRENT_SOURCE_DIR}}/../driver.c)
set_source_files_properties(${{UB_DRIVER_C}} PROPERTIES
                            COMPILE_DEFINITIONS "UB_DRIVER_IO_STDIO;main=ub_driver_main")
add_executable(ub_{m}_offload_driver offload_main.c ${{UB_DRIVER_C}})
target_link_libraries(ub_{m}_offload_driver PRIVATE ub_{m})
target_compile_options(ub_{m}_offload_driver PRIVATE -O2 -Wall)
"""


def render_cpu_driver(out_dir: Path, model_name: str) -> Path:
    """out_dir/offload_cpu: the CPU part as a program for a CPU target's emulator (the Android
    CPU under qemu-aarch64): the project's driver, after opening the session with the DSP
    part on the two FIFOs named on its command line."""
    cpu = out_dir / "offload_cpu"
    cpu.mkdir(parents=True, exist_ok=True)
    (cpu / "offload_main.c").write_text(
        ENV.get_template("offload.c.j2").render(variant="cpu_main", m=model_name))
    (cpu / "CMakeLists.txt").write_text(CPU_DRIVER_CMAKE.format(m=model_name))
    return cpu


def build_dsp(dsp_dir: Path, toolchain: Path) -> Path:
    build = cmake_build(dsp_dir, dsp_dir / "build", shared=False, toolchain=toolchain)
    binary = build / "ub_dsp"
    if not binary.is_file():
        raise BuildError(f"the DSP part was not built in {build}")
    return binary
