"""The kernels of one compiled model: TIR PrimFuncs scheduled, lowered and printed once each.

Kernel names follow docs/conventions.md: `ub_<dtype>_<op>__<isa>`, where the op part is the
PrimFunc's name (made unique) and the ISA is `scalar` for the printed plain-C variant.
A library for an ISA with micro-kernels (kernels/microkernels/) renders those instead where
one matches the kernel's op: `ub_<dtype>_<op>_ukernel_<tile>__<isa>`, with the code they
share (packers, the GEMM micro-kernel) emitted once ahead of the kernels.
"""

from __future__ import annotations

import re

import tvm_ffi
from tvm import tirx

from ..errors import CompileError
from ..lowering.tir_lower import lower_prim_func
from . import microkernels
from .c_printer import CKernel, print_kernel
from .microkernels.manifest import LANE_FAMILIES
from .schedules import schedule

DTYPE_TOKENS = {"float32": "f32", "int8": "s8", "int32": "s32", "int64": "s64", "bool": "b8"}


class KernelLibrary:
    def __init__(self, isa: str = "scalar", reuse_outputs: bool = True):
        self.isa = isa  # the target's micro-kernel ISA; printed kernels are always `scalar`
        self.reuse_outputs = reuse_outputs  # fused intermediates may live in their output
        self.kernels: dict[str, CKernel] = {}
        self.support: dict[str, str] = {}  # code shared by micro-kernels, by name
        self._by_hash: dict[tuple, list[tuple[tirx.PrimFunc, CKernel]]] = {}  # (hash, aliases)
        self.lowered: dict[str, tirx.PrimFunc] = {}  # kernel name -> the TIR it was printed from
        self._variants: dict[tuple, str] = {}  # (kernel, aliases) -> its in-place variant

    def add(self, func: tirx.PrimFunc, op_name: str,
            aliases: dict[int, int] | None = None) -> CKernel:
        """Print `func` unless a structurally equal kernel is already in the library.

        A kernel with `aliases` is called with outputs over inputs (see `print_kernel`)."""
        key = (tvm_ffi.structural_hash(func), frozenset((aliases or {}).items()))
        for known, kernel in self._by_hash.get(key, []):
            if tvm_ffi.structural_equal(known, func):
                return kernel
        out_dtype = str(func.params[-1].dtype) if func.params else "float32"
        dtype = DTYPE_TOKENS.get(out_dtype, out_dtype)
        planned = None if aliases else microkernels.plan(func, self.isa)
        if planned is not None:
            kernel = self._add_microkernel(func, dtype, *planned)
            if planned[0] in LANE_FAMILIES:  # costed and paired in place by the TIR it replaces
                self.lowered[kernel.name] = self._lower(func, op_name)
            self._by_hash.setdefault(key, []).append((func, kernel))
            return kernel
        base = f"ub_{dtype}_{_c_ident(op_name)}"
        name, i = f"{base}__scalar", 1
        while name in self.kernels:
            name, i = f"{base}{i}__scalar", i + 1
        lowered = self._lower(func, op_name)
        kernel = print_kernel(lowered, name, aliases, self.reuse_outputs)
        self.kernels[name] = kernel
        self.lowered[name] = lowered
        self._by_hash.setdefault(key, []).append((func, kernel))
        return kernel

    @staticmethod
    def _lower(func: tirx.PrimFunc, op_name: str) -> tirx.PrimFunc:
        try:
            return lower_prim_func(schedule(func))
        except Exception as err:
            raise CompileError(f"lowering kernel {op_name} failed: {err}") from err

    def microkernel_name(self, op: str, dtype: str = "f32", family: str | None = None) -> str:
        """`ub_<dtype>_<op><i>_ukernel_<tile>__<isa>` (docs/conventions.md), the first not taken."""
        tile = microkernels.tile(self.isa, family)
        name, i = f"ub_{dtype}_{op}_ukernel_{tile}__{self.isa}", 1
        while name in self.kernels:
            name, i = f"ub_{dtype}_{op}{i}_ukernel_{tile}__{self.isa}", i + 1
        return name

    def _add_microkernel(self, func, dtype, family, op, params) -> CKernel:
        name = self.microkernel_name(op, dtype, family)
        try:
            kernel = microkernels.render_kernel(func, self.isa, family, name, params)
            self.support.update(microkernels.support_sources(self.isa))
        except Exception as err:  # a template that does not render is a bug: say which
            raise CompileError(f"rendering micro-kernel {name} ({family}, {self.isa}) failed: "
                               f"{err}; compile for a target with isa 'scalar' to avoid it"
                               ) from err
        self.kernels[name] = kernel
        return kernel

    def add_rendered(self, kernel: CKernel) -> CKernel:
        """A kernel that a program rewrite rendered itself (a fused or variant micro-kernel),
        under a name `microkernel_name` gave it."""
        if kernel.name in self.kernels:
            raise CompileError(f"kernel {kernel.name} is in the library already")
        self.kernels[kernel.name] = kernel
        return kernel

    def in_place_variant(self, name: str, aliases: dict[int, int]) -> CKernel:
        """Kernel `name` printed again for calls whose outputs overwrite inputs, as
        `aliases` ({input index: output index}) says: `ub_<dtype>_<op>_inplace<i>__<isa>`,
        one per kernel and set of aliases; an alias-safe micro-kernel is its own."""
        if self.kernels[name].alias_safe:
            return self.kernels[name]
        key = (name, frozenset(aliases.items()))
        if key not in self._variants:
            base, _, isa = name.rpartition("__")
            variant, i = f"{base}_inplace__{isa}", 1
            while variant in self.kernels:
                variant, i = f"{base}_inplace{i}__{isa}", i + 1
            self.kernels[variant] = print_kernel(self.lowered[name], variant, aliases,
                                                 self.reuse_outputs)
            self.lowered[variant] = self.lowered[name]
            self._variants[key] = self._variants[(variant, key[1])] = variant
        return self.kernels[self._variants[key]]

    def unread_arguments(self) -> dict[str, frozenset]:
        """{kernel: the argument indices it takes but reads through another's pointer}."""
        return {name: k.unread for name, k in self.kernels.items() if k.unread}

    def prim_func(self, name: str) -> tirx.PrimFunc | None:
        """The PrimFunc kernel `name` was made from (None for an in-place variant)."""
        for pairs in self._by_hash.values():
            for func, kernel in pairs:
                if kernel.name == name:
                    return func
        return None

    def sources(self, called=None) -> list[str]:
        """The kernels that `called` (kernel names the programs call; None: all) reach,
        directly or through another kernel (an in-place rewrite or a fusion leaves kernels
        behind that nothing calls). The code they share is `support`."""
        if called is None:
            kept = set(self.kernels)
        else:
            kept, todo = set(), [n for n in called if n in self.kernels]
            while todo:
                name = todo.pop()
                if name not in kept:
                    kept.add(name)
                    todo += [n for n in CALLED.findall(self.kernels[name].source)
                             if n in self.kernels]
        return [k.source for name, k in self.kernels.items() if name in kept]


# the ub_ functions a C source calls (kernels calling kernels; project/kernel_files.py)
CALLED = re.compile(r"\b(ub_\w+)\s*\(")


def _c_ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower() or "kernel"
