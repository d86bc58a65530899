"""Which micro-kernels exist: per ISA, its GEMM micro-kernel (template and register tile);
per op family, the template that drives it and the name of the generated kernel.

Adding an ISA: a GEMM template under templates/<isa>/ and a row in GEMM_CORES. Adding an op
family: a matcher in match.py, a template under templates/common/ (or per ISA) and a row in
FAMILIES. Names follow docs/conventions.md: ub_<dtype>_<op>_ukernel_<tile>__<isa>.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmCore:
    template: str
    mr: int  # rows of C held in registers
    nr: int  # columns of C held in registers
    header: str  # the intrinsics header the core includes
    nt_tile: str = "4x4"  # rows x columns of C of the NT GEMM (the conv weight gradient)
    # vectors of sums a direct run (templates/common/direct_run.c.j2) may keep in
    # registers: half of the ISA's vector registers, the rest for the loaded operands
    run_sums: int = 4
    # the floats of one vector of those sums (common/direct_run.c.j2)
    vec: int = 4
    # the vector lanes of the channel reductions (common/batch_norm.c.j2); the floats a step,
    # the template's LANES, name those kernels' tile: u<LANES>
    lanes: str = "common/lanes_plain.c.j2"
    # a data cache that the hardware prefetches into: channel reductions read the planes in
    # memory order, their lanes in scratch (common/batch_norm.c.j2's `stream`)
    caches: bool = True

    @property
    def tile(self) -> str:
        return f"{self.mr}x{self.nr}"


GEMM_CORES = {
    "neon": GemmCore("neon/gemm.c.j2", 6, 8, "arm_neon.h", run_sums=16,
                     lanes="neon/lanes.c.j2"),
    # Cortex-M4F/M7: the scalar FPU, register-blocked (CMSIS-DSP's token; no CMSIS code);
    # a vector of four is four of its 32 single registers
    "cmsis_dsp": GemmCore("cmsis_dsp/gemm.c.j2", 4, 4, "math.h", caches=False),
    # x86-64 hosts: AVX2 + FMA behind a run-time CPU check, plain C otherwise (XNNPACK's token)
    "avx2": GemmCore("x86/gemm.c.j2", 6, 16, "immintrin.h", nt_tile="3x3", run_sums=8, vec=8,
                     lanes="x86/lanes.c.j2"),
}

# Families whose kernel name's tile is the ISA's reduction lanes, not its GEMM tile. They do
# the work of the kernel they replace, loop for loop, so the cost model (memory/cost_model.py)
# and the in-place analysis (program/inplace.py) read that kernel's TIR for them.
LANE_FAMILIES = {"batch_norm"}

# family -> (template, op token of the kernel name per mode)
FAMILIES = {
    "conv2d": ("common/conv2d.c.j2", {"forward": "conv2d", "bwd_data": "conv2d_bwd_data",
                                      "bwd_weight": "conv2d_bwd_weight"}),
    "depthwise": ("common/depthwise.c.j2", {"forward": "dwconv2d",
                                            "bwd_data": "dwconv2d_bwd_data",
                                            "bwd_weight": "dwconv2d_bwd_weight"}),
    "depthwise_strided": ("common/depthwise_strided.c.j2", {"forward": "dwconv2d",
                                                            "bwd_data": "dwconv2d_bwd_data",
                                                            "bwd_weight": "dwconv2d_bwd_weight"}),
    "matmul": ("common/matmul.c.j2", {None: "matmul", "nt": "matmul_nt"}),
    "max_pool2d_backward": ("common/max_pool2d_backward.c.j2", {None: "max_pool2d_backward"}),
    "batch_norm": ("common/batch_norm.c.j2", {"stats": "batch_norm_stats",
                                              "backward": "batch_norm_backward"}),
}

# Support code that kernels share, emitted once per model before the kernels.
SUPPORT = {"pack": "common/pack.c.j2"}


def gemm_name(isa: str) -> str:
    return f"ub_f32_gemm_ukernel_{GEMM_CORES[isa].tile}__{isa}"


def core_names(isa: str) -> dict:
    """The three functions of an ISA's GEMM template: the GEMM, the indirect GEMM (rows of
    B at offsets) and the NT GEMM (A . B^T)."""
    core = GEMM_CORES[isa]
    return {"gemm": gemm_name(isa), "igemm": f"ub_f32_igemm_ukernel_{core.tile}__{isa}",
            "gemm_nt": f"ub_f32_gemm_nt_ukernel_{core.nt_tile}__{isa}"}
