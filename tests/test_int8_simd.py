"""The int8 inner loops with intrinsics (NEON SMULL/SADALP/SMLAL/SDOT, Cortex-M SXTB16+SMLAD,
HVX vrmpy): dot, axpy, both gemms and the rescaling rows (max-abs OR reduction, RoundShift and
PstoShift with their saturation flag) against the plain-C variant, over int8/int32 extremes and
every shift 0..31, on each target: one check program per target, built by
its cross compiler and run under its emulator (int8/simd.py). A missing toolchain skips
locally and fails in CI (CI=true)."""

import subprocess

import pytest
from harness import require_tools

from ubitrain.int8.simd import build_check, run_check
from ubitrain.runtime.target_build import toolchain_file
from ubitrain.targets import TARGETS, get_target


@pytest.mark.parametrize("target_name", list(TARGETS))
def test_simd_variant_equals_scalar(tmp_path, target_name):
    target = get_target(target_name)
    if not target.runs_on_host:
        require_tools(target_name)
    isa = target.kernel_isa("int8")
    binary = build_check(target, isa, tmp_path / "check",
                         None if target.runs_on_host else toolchain_file(target))
    assert run_check(target, binary) == 0, f"{isa} differs from scalar on {target_name}"


def test_neon_dotprod_variant_equals_scalar(tmp_path):
    """The SDOT path (Armv8.2-A dot product), which the armv8-a build of aarch64-neon leaves
    out: built with +dotprod and run under qemu-aarch64 (its default CPU has the extension)."""
    target = get_target("aarch64-neon")
    require_tools("aarch64-neon")
    binary = build_check(target, "neon", tmp_path / "check", toolchain_file(target),
                         flags="-march=armv8.2-a+dotprod")
    disassembly = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(binary)],
                                 capture_output=True, text=True).stdout
    assert "sdot" in disassembly
    assert run_check(target, binary) == 0
