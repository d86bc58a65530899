"""The int8 step split between a CPU part and a DSP part (hexagon-v66), joined by the offload
interface of runtime_c (ub_offload.h).

Each maximal run of consecutive kernels that the placement (placement.py) puts on the DSP
becomes one method of the DSP part: the CPU part's step calls `ub_dsp_segment_<k>`, which
invokes method k with every tensor the run touches (in: all of them; out: those it writes),
and the DSP part runs the same kernels (its HVX variants) on its own copy of the arena at the
same offsets: both parts are generated from one memory plan, so the DSP's graph is prepared
at compile time and each step only executes it. The CPU part's copy of the arena stays the
master copy, so the split step computes exactly what the all-CPU step computes.

The CPU part runs in this process (NITI(cpu_target="host")) or as a program under the
Android CPU's emulator (cpu_target="aarch64-neon", render_cpu_driver), the DSP part always
under qemu-hexagon; the two talk over pipes.

The CPU part submits each segment and waits for it as late as the data allow (overlap.py);
the weight-gradient convolutions go image chunk by image chunk within the DSP's cache budget
(program.py, weight_grad_chunk).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError, CompileError
from ..kernels.c_printer import c_type
from ..program.ir import Call, Program
from ..runtime.build import cmake_build
from .program import ENV

RUNTIME_C = Path(__file__).resolve().parent.parent / "runtime_c"
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
    return ENV.get_template("niti_offload.c.j2").render(
        variant="cpu", m=model_name,
        segments=[dict(method=s.method, buffers=s.buffers(plan), overlap=during[s.method])
                  for s in segments])


def _statement(kernel: str, call: Call, plan) -> str:
    """`kernel` (the DSP variant) called on the slots of the CPU part's `call`."""
    args = [f"A + {plan.offsets[call.scratch]}u" if call.scratch else "NULL"]
    for i, s in enumerate(call.args):
        const = "" if i in call.outputs else "const "
        args.append(f"(({const}{c_type(s.dtype)} *)(A + {plan.offsets[s.root]}u))")
    return f"UB_TRY({kernel}({', '.join(args)}));"


def render_dsp(out_dir: Path, model_name: str, train: Program, dsp_train: Program,
               dsp_kernels: list[str], segments: list[Segment], plan) -> Path:
    """The DSP part's project in out_dir/dsp: the kernels of `dsp_train` (the same program
    built with HVX kernels, call for call) on the slots of `train`, which the plan placed."""
    segs = []
    for seg in segments:
        body = [_statement(dsp_train.calls[k].kernel, train.calls[k], plan) for k in seg.calls]
        segs.append(dict(method=seg.method, buffers=seg.buffers(plan), body=body))
    dsp = out_dir / "dsp"
    (dsp / "runtime_c").mkdir(parents=True, exist_ok=True)
    for name in ("ub_runtime.h", "ub_math.h", "ub_status.h"):
        shutil.copy(RUNTIME_C / name, dsp / "runtime_c" / name)
    source = ENV.get_template("niti_offload.c.j2").render(
        variant="dsp", m=model_name, kernels=dsp_kernels, segments=segs,
        arena_bytes=plan.arena_bytes, alignment=plan.alignment,
        max_buffers=max((len(s["buffers"]) for s in segs), default=1))
    (dsp / "dsp_main.c").write_text(source)
    (dsp / "CMakeLists.txt").write_text(DSP_CMAKE)
    return dsp


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
        ENV.get_template("niti_offload.c.j2").render(variant="cpu_main", m=model_name))
    (cpu / "CMakeLists.txt").write_text(CPU_DRIVER_CMAKE.format(m=model_name))
    return cpu


def build_dsp(dsp_dir: Path, toolchain: Path) -> Path:
    build = cmake_build(dsp_dir, dsp_dir / "build", shared=False, toolchain=toolchain)
    binary = build / "ub_dsp"
    if not binary.is_file():
        raise BuildError(f"the DSP part was not built in {build}")
    return binary
