"""A large model's kernels in several C files, so that the C build runs on every core.

One model.c of 1.4 MB (googlenet at 3x32x32) took gcc -O3 20 s on one core while the other
idled. Above KERNEL_FILE_BYTES of kernel code, the kernels go to an even number of
model_kernels_<i>.c files of at most about that size, which CMake compiles in parallel (before
model.c, so that the longest compiles start first), and model.c includes
model_kernels.h, which declares them. There the kernels have external linkage
(UB_KERNEL_EXTERN, runtime_c/ub_runtime.h) under names prefixed with the model's, so that two
generated models still link into one program. The code is the same as in one file: the
kernels are never inlined into the step (UB_KERNEL), and each file has its own copy of the
helpers the kernels share (static), so the step computes the same bits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..kernels.library import CALLED

KERNEL_FILE_BYTES = 192 * 1024
MAX_KERNEL_FILES = 8

# `UB_KERNEL [UB_NO_LOOP_VECTORIZE ...] int32_t ub_f32_x__scalar(params) {` at a line's start
_KERNEL = re.compile(r"^UB_KERNEL\s+(?:UB_\w+\s+)*(\w+)\s+(ub_\w+)\s*\(([^)]*)\)\s*\{", re.M)
# any function defined at a line's start: the names a kernel's helpers have
_DEFINED = re.compile(r"^[A-Za-z_][\w\s*]*?\b(ub_\w+)\s*\([^;{]*\)\s*\{", re.M)


@dataclass
class KernelFiles:
    header: list[str]  # model_kernels.h: a rename and a prototype per kernel
    files: list[list[str]]  # the kernel sources of each model_kernels_<i>.c


def split_kernels(model: str, kernels: list[str],
                  max_bytes: int | None = None) -> KernelFiles | None:
    """The kernels in files of about `max_bytes` each, or None when one file is enough.

    Sources that call a function another source defines stay in one file with it (a lane
    kernel and its dispatcher), so that no static function is called across files. Sources
    that define no UB_KERNEL (the int8 layer library) are not split."""
    max_bytes = max_bytes or KERNEL_FILE_BYTES
    total = sum(len(k) for k in kernels)
    if total <= max_bytes or len(kernels) < 2 or not all(map(_KERNEL.search, kernels)):
        return None
    groups = _call_groups(kernels)
    count = -(-total // max_bytes)
    count += count % 2  # even: on two (or four) cores the files finish together
    count = min(MAX_KERNEL_FILES, len(groups), count)
    files: list[list[int]] = [[] for _ in range(count)]
    sizes = [0] * count
    for group in sorted(groups, key=lambda g: -sum(len(kernels[i]) for i in g)):
        lightest = sizes.index(min(sizes))  # largest first, into the lightest file
        files[lightest] += group
        sizes[lightest] += sum(len(kernels[i]) for i in group)
    header = []
    for source in kernels:
        for ret, name, params in _KERNEL.findall(source):
            header.append(f"#define {name} ub_{model}_{name[len('ub_'):]}")
            header.append(f"{ret} {name}({' '.join(params.split())});")
    return KernelFiles(header, [[kernels[i] for i in sorted(f)] for f in files if f])


def _call_groups(kernels: list[str]) -> list[list[int]]:
    """Indices of `kernels`, grouped: a source with the sources whose functions it calls."""
    owner = {name: i for i, source in enumerate(kernels) for name in _DEFINED.findall(source)}
    parent = list(range(len(kernels)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, source in enumerate(kernels):
        for name in CALLED.findall(source):
            j = owner.get(name)
            if j is not None:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(kernels)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())
