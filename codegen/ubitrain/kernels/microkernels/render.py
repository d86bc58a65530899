"""Render micro-kernels from their Jinja templates into CKernels for the kernel library."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from ...ops.tagging import op_info
from ..c_printer import CKernel
from .manifest import FAMILIES, GEMM_CORES, LANE_FAMILIES, SUPPORT, GemmCore, core_names, gemm_name
from .match import match

TEMPLATES = Path(__file__).parent / "templates"
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                          lstrip_blocks=True, keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined)


def vector_segments(width: int, vec: int) -> list[tuple[int, int]]:
    """(first column, floats) of each sum of a direct run over `width` columns: vectors of
    `vec` floats, then one of 4 where `vec` is wider and four columns are left, then single
    floats (common/direct_run.c.j2)."""
    full = width - width % vec
    half = 4 if vec > 4 and width % vec >= 4 else 0
    return ([(j, vec) for j in range(0, full, vec)] + ([(full, 4)] if half else [])
            + [(j, 1) for j in range(full + half, width)])


_ENV.globals["vector_segments"] = vector_segments


def render_template(template: str, **params) -> str:
    return _ENV.get_template(template).render(**params)


def support_sources(isa: str) -> dict[str, str]:
    """The shared code the micro-kernels of `isa` call: packers, the GEMM micro-kernel."""
    return dict(_support_sources(isa))


@functools.cache  # the same text for every kernel of `isa`: rendered once, not per kernel
def _support_sources(isa: str) -> dict[str, str]:
    core = GEMM_CORES[isa]
    tails = [m for m in (4, 2, 1) if m < core.mr]  # remainders of M, largest first
    sources = {gemm_name(isa): render_template(core.template, mr=core.mr, nr=core.nr, tails=tails,
                                       **core_names(isa))}
    sources.update({f"{name}_{isa}": render_template(t, isa=isa) for name, t in SUPPORT.items()})
    return sources


def available(isa: str) -> bool:
    return isa in GEMM_CORES


def tile(isa: str, family: str | None = None) -> str:
    """The tile token of a micro-kernel's name: the GEMM's register tile, or u<lanes>."""
    core = GEMM_CORES[isa]
    if family in LANE_FAMILIES:  # the floats a step of the ISA's lanes
        return f"u{_lanes(core.lanes)}"
    return core.tile


def plan(func, isa: str):
    """(family, op token, parameters) of the micro-kernel for `func` on `isa`, or None."""
    if not available(isa):
        return None
    info = op_info(func)
    if info is None:
        return None
    out_shape = [int(d) for d in func.params[-1].shape]
    found = match(info, out_shape)
    if found is None:
        return None
    family, params = found
    if family in LANE_FAMILIES:
        params = {**params, **_lane_order(isa, params)}
    return family, FAMILIES[family][1][params.get("mode")], params


def _lanes(template: str) -> int:
    """The floats a step of a lanes template (its LANES)."""
    return _ENV.get_template(template).module.LANES


def _lane_order(isa: str, params: dict) -> dict:
    """Where the core has caches, a channel reduction streams its planes in memory order
    with every channel's sums in scratch, then 3 floats of dx factors a channel. The sums:
    where the backward splits its float64 sums (split: each plane summed in float32 lanes
    first, as PyTorch's CPU backward does, where the lanes template has psum), two float64
    totals; else the lanes, [C][4][LANES], LANES the larger of the ISA's and the plain
    fallback's (x86 renders both)."""
    core = GEMM_CORES[isa]
    if not core.caches:
        return dict(stream=False, split=False)
    if params["mode"] == "backward" and params["acc"] == "float64" \
            and hasattr(_ENV.get_template(core.lanes).module, "psum"):
        return dict(stream=True, split=True, scratch_bytes=params["C"] * (2 * 8 + 12))
    lanes = max(_lanes(core.lanes), _lanes(GemmCore.lanes))
    acc_bytes = 8 if params["acc"] == "float64" else 4
    return dict(stream=True, split=False,
                scratch_bytes=params["C"] * (4 * lanes * acc_bytes + 12))


def render_kernel(func, isa: str, family: str, name: str, params: dict,
                  extra_inputs: tuple[int, ...] = ()) -> CKernel:
    """The CKernel of a micro-kernel: called like the scalar kernel of `func` (its parameters
    in order, outputs last, scratch first). Parameters are named in0, in1, ... and out (out0,
    out1, ... where there are several outputs); a, b and out name the first three.
    `extra_inputs`: inputs a fused variant reads after `func`'s, each shaped like the input
    of `func` at that index."""
    inputs = len(op_info(func)["shapes"])
    outputs = len(func.params) - inputs
    ins = [f"in{i}" for i in range(inputs + len(extra_inputs))]
    outs = ["out"] if outputs == 1 else [f"out{i}" for i in range(outputs)]
    core = GEMM_CORES[isa]
    source = render_template(FAMILIES[family][0], name=name, isa=isa, a=ins[0],
                             b=(ins + [None])[1], out=outs[0], ins=ins, outs=outs,
                             run_sums=core.run_sums, vec=core.vec, lanes=core.lanes,
                             **core_names(isa), **params)
    tensors = []
    buffers = list(func.params[:inputs]) + [func.params[i] for i in extra_inputs] \
        + list(func.params[inputs:])
    for cname, buffer in zip(ins + outs, buffers):
        elements = 1
        for d in buffer.shape:
            elements *= int(d)
        tensors.append((cname, str(buffer.dtype), elements))
    return CKernel(name=name, source=source, params=tensors,
                   written=set(range(len(ins), len(tensors))),
                   scratch_bytes=params["scratch_bytes"],
                   notes=[f"micro-kernel {family} for {isa}"],
                   alias_safe=params.get("alias_safe", False))
