"""`ubitrain targets`: the targets --target accepts, as their Target describes them."""

from __future__ import annotations

from .common import formatter

TARGETS_HELP = "List the targets that --target accepts."
TARGETS_EPILOG = """\
examples:
  ubitrain targets
  ubitrain compile examples/digits_factory.py:factory --target host
  ubitrain compile examples/digits_factory.py:factory --target cortex-m4
  ubitrain demo --target cortex-m4"""


def add_parser(sub):
    sub.add_parser("targets", help="list the compile targets", description=TARGETS_HELP,
                   epilog=TARGETS_EPILOG, formatter_class=formatter)


def run(args) -> int:
    from ..targets import TARGETS

    def size(n: int) -> str:
        return f"{n // 1048576} MiB" if n % 1048576 == 0 else f"{n // 1024} KiB"

    width = max(len(name) for name in TARGETS)
    pad = " " * (width + 2)
    for name, t in TARGETS.items():
        where = "runs here" if t.runs_on_host else "cross-compiled, runs under QEMU"
        isas = ", ".join(f"{dtype} {isa}" for dtype, isa in t.isas)
        print(f"{name:<{width}}  {t.description} [kernels: {isas}; {where}]")
        if t.runs_on_host:
            continue
        print(f"{pad}compiler: {t.compiler} {t.compile_flags} "
              f"(targets/{t.toolchain_dir}/toolchain.cmake)")
        print(f"{pad}vectors {t.vector_bytes} B, accumulate {t.accumulate_dtype}, kernels: "
              f"{', '.join(t.kernel_variants)}")
        print(f"{pad}run: {' '.join(t.emulator_command('<binary>'))}")
        if t.board is not None:
            b = t.board
            print(f"{pad}board {b.name}: flash {size(b.flash_bytes)}, SRAM {size(b.sram_bytes)} "
                  f"(stack {size(b.stack_bytes)})")
    return 0
