"""Render the generated C project: model.h, model.c, CMakeLists.txt and a copy of runtime_c.

Every call of a step program becomes one C statement; the arena offsets come from the
memory plan, so the statements index one caller-supplied arena and nothing else.
"""

from __future__ import annotations

import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np

from ..errors import CompileError
from ..kernels.c_printer import c_float_literal, c_type
from ..memory.plan import MemoryPlan
from ..program.gradient_clipping import clip_statement
from ..program.ir import Call, Program, Slot
from ..program.micro_batch import BEGIN, END, call_repeats
from ..targets import Target
from .kernel_files import split_kernels

TEMPLATES = Path(__file__).parent / "templates"
# The initial state and the constants of at least BLOB_MIN_BYTES go to weights.bin, which the
# assembler embeds (UB_EMBED_FILE): C literals of millions of floats took the C compiler
# longer than the rest of the model together.
WEIGHTS_FILE = "weights.bin"
BLOB_MIN_BYTES = 64
RUNTIME_C = Path(__file__).parent.parent / "runtime_c"  # a link to the top-level runtime_c/
TARGET_FILES = Path(__file__).parent.parent / "target_files"  # a link to the top-level targets/
# A board target's project also holds an example firmware and a host script (docs/board.md).
BOARD_FILES = (("board_main.c.j2", "board_main.c"), ("board_batch.h.j2", "board_batch.h"),
               ("host_client.py.j2", "host_client.py"))
BOARD_BATCH_BIN = "board_batch.bin"
DTYPE_CODES = {"float32": "UB_F32", "int64": "UB_I64", "int32": "UB_I32", "int8": "UB_I8"}
KIND_CODES = {"parameter": "UB_PARAMETER", "buffer": "UB_BUFFER",
              "optimizer_state": "UB_OPTIMIZER_STATE"}


def c_array(values: np.ndarray) -> str:
    flat = np.asarray(values).reshape(-1)
    if flat.size == 0:
        return "{0}"
    if flat.dtype.kind == "f":
        # Hexadecimal float literals are exact: the C starts from PyTorch's very bits.
        suffix = "f" if flat.dtype == np.float32 else ""
        items = [float(v).hex() + suffix if np.isfinite(v) else c_float_literal(float(v),
                 str(flat.dtype)) for v in flat]
    elif flat.dtype == np.int64:
        items = [f"INT64_C({int(v)})" for v in flat]
    else:
        items = [str(int(v)) for v in flat]
    lines = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
    return "{\n    " + ",\n    ".join(lines) + "\n}"


@dataclass
class _Io:
    name: str
    dtype: str
    shape: list
    elements: int
    ctype: str
    index_bound: int | None = None  # embedding ids: the step checks each is in [0, bound)


def _io(slot: Slot, name: str | None = None) -> _Io:
    return _Io(name or slot.name, slot.dtype, list(slot.shape), int(np.prod(slot.shape)),
               c_type(slot.dtype), slot.index_bound)


class CallPrinter:
    """The C statement of a call of a program, over the plan's arena."""

    def __init__(self, plan: MemoryPlan, constants: dict, externals: dict, unread: dict):
        self.plan, self.constants, self.externals = plan, constants, externals
        self.unread = unread  # kernel -> arguments read through another's pointer: NULL

    def pointer(self, slot: Slot, writable: bool) -> str:
        root = slot.root
        if root.kind == "constant":
            return self.constants[id(root)]
        if root.external:
            return self.externals[id(root)]
        ctype = c_type(slot.dtype)
        const = "" if writable else "const "
        return f"(({const}{ctype} *)(A + {self.plan.offsets[root] + slot.root_offset}u))"

    def statement(self, call: Call) -> str:
        if call.builtin:
            return getattr(self, call.kernel)(call)
        scratch = (f"A + {self.plan.offsets[call.scratch]}u" if call.scratch else "NULL")
        unread = self.unread.get(call.kernel, ())
        args = [scratch] + ["NULL" if i in unread else self.pointer(a, i in call.outputs)
                            for i, a in enumerate(call.args)]
        return f"UB_TRY({call.kernel}({', '.join(args)}));"

    def ub_copy(self, call):
        src, dst = call.args
        return (f"memcpy({self.pointer(dst, True)}, {self.pointer(src, False)}, "
                f"{src.nbytes}u);")

    def ub_dropout_mask(self, call):
        (mask,) = call.args
        n = int(np.prod(mask.shape))
        p = float(np.float32(call.attrs["p"]))
        # computed in double by the frontend (Dropout's 1/(1-p)), rounded once to float
        scale = float(np.float32(call.attrs["scale"]))
        return (f"ub_dropout_mask(&ctx->rng_state, {self.pointer(mask, True)}, {n}u, "
                f"{c_float_literal(p, 'float32')}, {c_float_literal(scale, 'float32')});")

    def ub_check_loss(self, call):
        return f"UB_TRY(ub_check_loss({self.pointer(call.args[0], False)}));"

    def ub_page_out(self, call):  # runtime_c/ub_paging.h; blocks chosen by program/remat.py
        (src,) = call.args
        return (f"UB_TRY(ub_page_out(ctx->page_storage, {call.attrs['block']}u, "
                f"{self.pointer(src, False)}, {src.nbytes}u));")

    def ub_page_in(self, call):
        (dst,) = call.args
        return (f"UB_TRY(ub_page_in(ctx->page_storage, {call.attrs['block']}u, "
                f"{self.pointer(dst, True)}, {dst.nbytes}u));")

    def ub_zero(self, call):  # a gradient accumulator before the first micro-batch
        (dst,) = call.args
        return f"memset({self.pointer(dst, True)}, 0, {dst.nbytes}u);"

    def ub_micro_batch_begin(self, call):  # program/micro_batch.py
        for micro, full in call.attrs["slices"]:  # the rows of micro-batch ub_mb
            rows = int(np.prod(micro.shape))
            whole = self.externals.get(id(full), full.name)  # the C parameter
            self.externals[id(micro)] = f"({whole} + (size_t)ub_mb * {rows}u)"
        return f"for (uint32_t ub_mb = 0; ub_mb < {call.attrs['count']}u; ++ub_mb) {{"

    def ub_micro_batch_end(self, call):
        return "} /* next micro-batch */"

    def ub_clip_grad_norm(self, call):  # program/gradient_clipping.py
        return clip_statement(call, self.pointer)

    def ub_optimizer_coefficients(self, call):
        coef = self.pointer(call.args[0], True)
        parts = [f"{coef}[{i}] = {code};" for i, code in enumerate(call.attrs["code"])]
        return "{ " + " ".join(parts) + " }"


def render_project(out_dir: Path, model_name: str, train: Program, predict: Program,
                   plan: MemoryPlan, kernels: list[str], state: dict, opt_state: dict,
                   trainable: list[str], inputs: list[Slot], labels: Slot, output: Slot,
                   classes: int | None, frozen: dict[str, str] | None = None,
                   unread: dict | None = None, shared: list[str] | None = None,
                   target: Target | None = None, trace_calls: bool = False,
                   example_batch: tuple | None = None) -> None:
    """`frozen`: {state name: kind} of the state kept in flash as constants
    (program/frozen_state.py); the tensor table lists them, read-only. `unread`: {kernel:
    argument indices it reads through another argument's pointer}, passed as NULL.
    `shared`: code the kernels share (micro-kernel helpers), ahead of them in every file that
    holds kernels (project/kernel_files.py). `target`: its toolchain files are copied into
    the project's toolchains/, so that the project builds wherever it is copied.
    `trace_calls`: after every call of a step, the C calls the function pointer
    ub_<model>_trace, when set, with the program, the call's index and the arena (a
    debugging aid: fidelity/trace.py compares each kernel's output with its PrimFunc).
    `example_batch`: (inputs, labels) as numpy arrays, the batch the model was compiled
    with; on a board target it becomes the example firmware's data (BOARD_FILES)."""
    frozen = frozen or {}
    blob = _Blob()
    constants, const_names = [], {}

    def constant(slot, name):
        """A constant array: a pointer into weights.bin when it is large, else a literal."""
        const_names[id(slot)] = name
        entry = dict(name=name, ctype=c_type(slot.dtype), elements=max(slot.value.size, 1))
        if slot.nbytes >= BLOB_MIN_BYTES:
            entry["blob"] = blob.add(slot.value)
        else:
            entry["data"] = c_array(slot.value)
        constants.append(entry)

    for name in frozen:  # named after the tensor, so that a map file or nm shows them
        constant(state[name], f"ub_frozen_{state[name].name}")
    for prog in (train, predict):
        for s in prog.slots():
            if s.kind == "constant" and s.view_of is None and id(s) not in const_names:
                constant(s, f"ub_const_{len(constants)}")
    externals = {id(x): x.name for x in inputs}
    externals[id(labels)] = "labels"
    for prog in (train, predict):
        for s in prog.slots():
            if s.kind == "output":
                externals[id(s)] = s.name  # "loss" in train_step, "output" in predict
    printer = CallPrinter(plan, const_names, externals, unread or {})
    shared = shared or []
    split = split_kernels(model_name, kernels)

    tensors, initial, zeroed = [], [], []
    trained = {t.split("[", 1)[0] for t in trainable}  # "fc.weight[0:4]": fc.weight trains
    for name, slot in state.items():
        if name in frozen:
            tensors.append(_tensor_row(name, slot, plan, frozen[name], False,
                                       flash=const_names[id(slot)]))
            continue
        tensors.append(_tensor_row(name, slot, plan, slot.kind, name in trained))
        initial.append(dict(offset=plan.offsets[slot], blob=blob.add(slot.value),
                            bytes=slot.nbytes))
    for slots in opt_state.values():
        for slot in slots:
            tensors.append(_tensor_row(slot.label, slot, plan, "optimizer_state", False))
            zeroed.append(dict(offset=plan.offsets[slot], bytes=slot.nbytes))

    context = dict(
        m=model_name, M=model_name.upper(), arena_bytes=plan.arena_bytes,
        alignment=plan.alignment, batch=inputs[0].shape[0] if inputs[0].shape else 1,
        inputs=[_io(x) for x in inputs], labels=_io(labels), output=_io(output),
        tensors=tensors, constants=constants, initial=initial, zeroed=zeroed,
        kernels=[] if split else shared + kernels,
        kernel_header=split.header if split else None,
        kernel_files=[f"model_kernels_{i}.c" for i in range(len(split.files))] if split else [],
        classes=classes, state_bytes=plan.persistent_bytes, model_id=_layout_id(tensors),
        staged_restore=plan.restore_is_atomic,
        train_body=[("    " if n > 1 and c.kernel not in (BEGIN, END) else "")
                    + printer.statement(c) + (f" UB_TRACE(0, {i});" if trace_calls else "")
                    for i, (n, c) in enumerate(zip(call_repeats(train), train.calls))],
        pages=sum(c.kernel == "ub_page_out" for c in train.calls),
        page_bytes_max=max((c.args[0].nbytes for c in train.calls if c.kernel == "ub_page_out"),
                           default=0),
        predict_body=[printer.statement(c) + (f" UB_TRACE(1, {i});" if trace_calls else "")
                      for i, c in enumerate(predict.calls)],
        trace=trace_calls,
        target=target.name if target is not None else "host",
        toolchain=target.toolchain_dir if target is not None else None,
        board=target.board.name if target is not None and target.board is not None else None,
    )
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / WEIGHTS_FILE).write_bytes(blob.data())
        for template, written in (("model.h.j2", "model.h"), ("model.c.j2", "model.c"),
                                  ("CMakeLists.txt.j2", "CMakeLists.txt"),
                                  ("driver.c.j2", "driver.c")):
            (out_dir / written).write_text(env.get_template(template).render(**context))
        for path in out_dir.glob("model_kernels*"):  # an earlier compile's split
            path.unlink()
        if split:
            (out_dir / "model_kernels.h").write_text(
                env.get_template("model_kernels.h.j2").render(**context))
            template = env.get_template("model_kernels.c.j2")
            for name, part in zip(context["kernel_files"], split.files):
                (out_dir / name).write_text(template.render(shared=shared, kernels=part))
        if context["board"] is not None:
            _render_board_files(env, out_dir, context, example_batch)
        shutil.copytree(RUNTIME_C, out_dir / "runtime_c", dirs_exist_ok=True)
        for folder in target.toolchain_dirs if target is not None else ():
            shutil.copytree(TARGET_FILES / folder, out_dir / "toolchains" / folder,
                            dirs_exist_ok=True)
    except OSError as err:
        raise CompileError(f"cannot write the C project to out_dir={str(out_dir)!r}: "
                           f"{err.strerror}; pass an out_dir you can write to") from None


def _render_board_files(env, out_dir: Path, context: dict, example_batch) -> None:
    """BOARD_FILES of a board target's project: the example firmware, its batch (a C header
    and the same bytes raw) and the host script that drives driver.c over a serial line."""
    if example_batch is None:
        raise CompileError("a board target's project needs the example batch (example_batch)")
    xs, y = example_batch
    arrays = []
    for io, value in zip(context["inputs"] + [context["labels"]], list(xs) + [y]):
        value = np.ascontiguousarray(np.asarray(value, dtype=io.dtype)).reshape(io.shape)
        arrays.append((io, value))
    batch = [dict(name=io.name, dtype=io.dtype, shape=io.shape, ctype=io.ctype,
                  data=c_array(value)) for io, value in arrays]
    (out_dir / BOARD_BATCH_BIN).write_bytes(b"".join(v.tobytes() for _, v in arrays))
    board_context = dict(context, batch_inputs=batch[:-1], batch_labels=batch[-1])
    for template, written in BOARD_FILES:
        (out_dir / written).write_text(env.get_template(template).render(**board_context))


class _Blob:
    """weights.bin: arrays back to back, each at a 16-byte aligned offset."""

    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, values: np.ndarray) -> int:
        raw = np.ascontiguousarray(values).tobytes()
        offset = self.size
        self.parts.append(raw + b"\0" * (-len(raw) % 16))
        self.size += len(self.parts[-1])
        return offset

    def data(self) -> bytes:
        return b"".join(self.parts) or b"\0" * 16  # an empty .incbin has no address


def _layout_id(tensors) -> int:
    """Tags checkpoints: names, shapes and offsets of the state, hashed."""
    text = ";".join(f"{t['name']}:{t['shape4']}:{t['offset']}:{t['bytes']}" for t in tensors)
    return zlib.crc32(text.encode())


def _tensor_row(name, slot, plan, kind, trainable, flash=None):
    """`flash`: the constant array of a frozen tensor (no arena offset), or None."""
    shape = list(slot.shape)
    if len(shape) > 4:
        raise CompileError(f"tensor {name} has {len(shape)} dimensions; at most 4 are supported")
    if slot.dtype not in DTYPE_CODES:  # (a bool buffer the step reads: a mask kept as state)
        raise CompileError(f"tensor {name} is {slot.dtype}, which the C tensor table has no "
                           f"code for ({', '.join(DTYPE_CODES)}); make a {slot.dtype} buffer "
                           "a plain tensor attribute (a constant) or an int64 buffer")
    return dict(name=name, kind=KIND_CODES[kind], dtype=DTYPE_CODES[slot.dtype], ndim=len(shape),
                shape4=", ".join(str(d) for d in shape + [0] * (4 - len(shape))),
                offset=0 if flash else plan.offsets[slot], bytes=slot.nbytes,
                trainable=int(trainable), flash=flash or "NULL")

