"""Print a lowered TIR PrimFunc as one plain C99 function.

TVM's own C backend wraps kernels in its packed-function ABI and prints vector types that
are not C, so ubitrain prints TIR itself. The input is a PrimFunc after `lower_prim_func`
(flat 1-D buffers, no blocks). The output is a `static` function that takes `restrict`
pointers in the PrimFunc's parameter order, with a scratch pointer first for the buffers
the kernel allocates internally, and returns UB_OK.

Expressions and intrinsics are spelled through tables, so that a target can override a
spelling (for example `expf`) without adding branches here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tvm_ffi
from tvm import ir, tirx
from tvm.ir import prim

from ..errors import CompileError
from .float_barrier import is_barrier
from .tir_access import UnknownTir, output_reuse, tensor_loads

C_TYPES = {
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "bool": "uint8_t",
}

BINARY_OPS = {
    prim.Add: "+", prim.Sub: "-", prim.Mul: "*", prim.Div: "/", prim.Mod: "%",
    prim.EQ: "==", prim.NE: "!=", prim.LT: "<", prim.LE: "<=", prim.GT: ">", prim.GE: ">=",
    prim.And: "&&", prim.Or: "||", prim.BitwiseAnd: "&", prim.BitwiseOr: "|",
    prim.BitwiseXor: "^", prim.LShift: "<<", prim.RShift: ">>",
}

# Intrinsics by op name (without its "tirx." / "prim." namespace):
# name -> (spelling for float32, spelling for float64). float32 exp, tanh and erf are the
# inline ones of runtime_c/ub_math.h, so that their loops (GELU, sigmoid, softmax) vectorize.
FLOAT_INTRINSICS = {
    "exp": ("ub_expf", "exp"), "log": ("logf", "log"), "sqrt": ("sqrtf", "sqrt"),
    "tanh": ("ub_tanhf", "tanh"), "erf": ("ub_erff", "erf"), "pow": ("powf", "pow"),
    "fabs": ("fabsf", "fabs"), "floor": ("floorf", "floor"), "ceil": ("ceilf", "ceil"),
    "trunc": ("truncf", "trunc"), "nearbyint": ("nearbyintf", "nearbyint"),
    "round": ("nearbyintf", "nearbyint"), "sin": ("sinf", "sin"), "cos": ("cosf", "cos"),
    "exp2": ("exp2f", "exp2"), "log2": ("log2f", "log2"), "log1p": ("log1pf", "log1p"),
    "fmod": ("fmodf", "fmod"), "isnan": ("isnan", "isnan"), "isinf": ("isinf", "isinf"),
    "isfinite": ("isfinite", "isfinite"),
}


def _is_zero(e) -> bool:
    return type(e) is prim.IntImm and int(e.value) == 0


def _is_bool_cast(e) -> bool:
    return type(e) is prim.Cast and dtype_of(e.value) == "bool"


def _loads(e) -> list | None:
    """The tensor loads of a pure expression (compares, arithmetic, casts, loads), or None
    for anything else (a call may have effects or trap)."""
    t = type(e)
    if t in (prim.IntImm, prim.FloatImm, ir.Var):
        return []
    if t is ir.TensorLoad:
        inner = [_loads(i) for i in e.indices]
        return None if any(x is None for x in inner) else [e] + sum(inner, [])
    if t in BINARY_OPS or t in (prim.Min, prim.Max):
        a, b = _loads(e.a), _loads(e.b)
        return None if a is None or b is None else a + b
    if t in (prim.Cast, prim.Not):
        return _loads(e.value if t is prim.Cast else e.a)
    return None


def _loads_covered(e, known: list | None) -> bool:
    """Every load of `e` is one of `known` (so evaluating `e` reads no new address)."""
    loads = _loads(e)
    if loads is None or known is None:
        return False
    return all(any(tvm_ffi.structural_equal(x, k) for k in known) for x in loads)


def dtype_of(e) -> str:
    """The scalar dtype of a TIR expression or variable ("float32", "int32", ...)."""
    return str(e.ty)


def c_type(dtype: str) -> str:
    try:
        return C_TYPES[str(dtype)]
    except KeyError:
        raise CompileError(f"dtype {dtype} has no C spelling; supported: {sorted(C_TYPES)}") \
            from None


def c_float_literal(value: float, dtype: str) -> str:
    suffix = "f" if dtype == "float32" else ""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "INFINITY"
    if dtype == "float32":
        value = float(np.float32(value))
    text = repr(value)
    return f"{text}{suffix}" if "e" in text or "." in text else f"{text}.0{suffix}"


@dataclass
class CKernel:
    """A printed kernel: its C source and what the step program needs to call it."""

    name: str
    source: str
    params: list[tuple[str, str, int]]  # (name, dtype, elements) in call order
    written: set[int]  # indices of params the kernel stores to
    scratch_bytes: int
    flops: int = 0
    notes: list[str] = field(default_factory=list)
    # outputs may be passed over the inputs the in-place analysis pairs them with, to this
    # kernel as it is (a template that reads each element before it writes it, unrestricted)
    alias_safe: bool = False
    # parameters an in-place variant reads through an output's pointer: its callers pass
    # NULL there, so that no two restrict parameters receive the same address
    unread: frozenset = frozenset()



class _Printer:
    def __init__(self, func: tirx.PrimFunc, name: str, in_place: bool = False,
                 reuse_outputs: bool = True):
        self.func = func
        self.name = name
        self.in_place = in_place
        self.lines: list[str] = []
        self.indent = 1
        self.buffer_names: dict = {}  # buffer data Var -> C name
        self.storage: dict = {}  # buffer -> the C name of its own storage (before aliasing)
        self.var_names: dict = {}
        self.used_names: set[str] = set()
        self.scratch: list[tuple[str, str, int]] = []  # (name, dtype, elements)
        self.written_vars: set[str] = set()  # C names of buffers stored to
        self.loads_on_both_sides = False  # a `?:` reads memory on both sides (conditional)
        # internal buffer -> the output parameter it lives in
        self.reuse = output_reuse(func) if reuse_outputs else {}

    # ---- names -------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() else "_" for c in hint) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, i = base, 1
        while name in self.used_names:
            name, i = f"{base}_{i}", i + 1
        self.used_names.add(name)
        return name

    def var(self, v) -> str:
        if v not in self.var_names:
            self.var_names[v] = self.fresh(v.name)
        return self.var_names[v]

    def buf(self, buffer) -> str:
        return self.buffer_names[buffer]

    # ---- expressions -------------------------------------------------------------------
    def expr(self, e) -> str:
        t = type(e)
        if t is prim.IntImm:
            dtype = dtype_of(e)
            if dtype == "bool":
                return "1" if e.value else "0"
            v = int(e.value)
            if dtype == "int64":  # INT64_MIN has no literal: its negation overflows
                return f"INT64_C({v})" if v > -(2**63) else "(INT64_C(-9223372036854775807) - 1)"
            if dtype.startswith("uint"):  # unsigned, so that the expression it is in is too
                return f"UINT64_C({v})" if dtype == "uint64" else f"{v}u"
            return str(v) if v >= -(2**31) + 1 else f"({v + 1} - 1)"
        if t is prim.FloatImm:
            return c_float_literal(float(e.value), dtype_of(e))
        if t is ir.Var:
            return self.var(e)
        if t is ir.TensorLoad:
            return f"{self.buf(e.source)}[{self.index(e.indices)}]"
        if t is prim.LT and _is_zero(e.a) and _is_bool_cast(e.b):
            # 0 < (int64)c is c: printed as it is, the cast to a wider integer keeps GCC
            # from vectorising the loop (the ReLU/ReLU6 gradients' where(c, dy, 0))
            return self.expr(e.b.value)
        if t in (prim.And, prim.Or) and _loads_covered(e.b, _loads(e.a)):
            # Both sides evaluated (`&`, `|` on 0/1) when the right one reads nothing the
            # left did not: no branch, so GCC vectorises the loop (ReLU6's gradient mask)
            op = "&" if t is prim.And else "|"
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        if t in BINARY_OPS:
            return f"({self.expr(e.a)} {BINARY_OPS[t]} {self.expr(e.b)})"
        if t is prim.FloorDiv:
            return self.floor_op("floordiv", e)
        if t is prim.FloorMod:
            return self.floor_op("floormod", e)
        if t in (prim.Min, prim.Max):
            macro = "UB_MIN" if t is prim.Min else "UB_MAX"
            a, b = e.a, e.b
            if dtype_of(e).startswith("float"):
                macro = macro.replace("UB_", "UB_F")  # NaN-propagating, as PyTorch's
                if isinstance(a, prim.FloatImm) and not isinstance(b, prim.FloatImm):
                    a, b = b, a
                if isinstance(b, prim.FloatImm) and b.value == b.value:
                    # a bound that is no NaN (clip, ReLU): one compare; in float32 a choice
                    # on bits (runtime_c/ub_math.h), which GCC keeps branch-free
                    if dtype_of(e) == "float32":
                        fn = "ub_fmin_k_f32" if t is prim.Min else "ub_fmax_k_f32"
                        return f"{fn}({self.expr(a)}, {self.expr(b)})"
                    macro += "_K"
            return f"{macro}({self.expr(a)}, {self.expr(b)})"
        if t is prim.Not:
            return f"(!{self.expr(e.a)})"
        if t is prim.BitwiseNot:
            return f"(~{self.expr(e.a)})"
        if t is prim.Cast:
            return f"(({c_type(dtype_of(e))}){self.expr(e.value)})"
        if t is prim.Select:
            if dtype_of(e) == "float32":  # TIR's Select evaluates both values: a choice
                # on their bits (runtime_c/ub_math.h) leaves GCC no branch to keep, which a
                # ?: can (an in-place ReLU gradient: 19% of resnet's b32 step, scalar)
                return (f"ub_pick_f32({self.expr(e.condition)}, {self.expr(e.true_value)}, "
                        f"{self.expr(e.false_value)})")
            return self.conditional(e.condition, e.true_value, e.false_value)
        if t is prim.Let:
            raise CompileError(f"kernel {self.name}: TIR Let expressions are not printed")
        if t is ir.Call:
            return self.call(e)
        raise CompileError(f"kernel {self.name}: the C printer has no rule for TIR {t.__name__}")

    def conditional(self, cond, a, b) -> str:
        """`cond ? a : b`; where both sides load, the kernel is kept from GCC's loop
        vectorizer, which gets such nests wrong (UB_NO_LOOP_VECTORIZE, runtime_c/ub_runtime.h)."""
        try:
            self.loads_on_both_sides |= bool(tensor_loads(a)) and bool(tensor_loads(b))
        except UnknownTir:
            self.loads_on_both_sides = True
        return f"({self.expr(cond)} ? {self.expr(a)} : {self.expr(b)})"

    def floor_op(self, kind: str, e) -> str:
        dtype = dtype_of(e)
        if dtype.startswith("float"):
            a, b = self.expr(e.a), self.expr(e.b)
            fn = "floorf" if dtype == "float32" else "floor"
            if kind == "floordiv":
                return f"{fn}({a} / {b})"
            return f"({a} - {fn}({a} / {b}) * {b})"
        # Integer floor division: non-negative operands (every index here) need no fix-up,
        # the helper handles the rest.
        bits = "64" if dtype == "int64" else "32"
        return f"ub_{kind}_i{bits}({self.expr(e.a)}, {self.expr(e.b)})"

    def call(self, e) -> str:
        full = e.op.name
        op = full.rsplit(".", 1)[-1]
        args = e.args
        f64 = dtype_of(e) == "float64"
        one = "1.0" if f64 else "1.0f"
        if op == "if_then_else":
            return self.conditional(*args)
        if op == "likely":
            return self.expr(args[0])
        if op == "sigmoid":
            exp = FLOAT_INTRINSICS["exp"][1 if f64 else 0]
            return f"({one} / ({one} + {exp}(-{self.expr(args[0])})))"
        if op == "rsqrt":
            return f"({one} / {'sqrt' if f64 else 'sqrtf'}({self.expr(args[0])}))"
        if op in FLOAT_INTRINSICS:
            f32_name, f64_name = FLOAT_INTRINSICS[op]
            fn = f64_name if dtype_of(args[0]) == "float64" else f32_name
            return f"{fn}({', '.join(self.expr(a) for a in args)})"
        if op == "reinterpret":  # runtime_c/ub_math.h: a float32's bits and back
            pair = (dtype_of(args[0]), dtype_of(e))
            spelling = {("float32", "uint32"): "ub_bits_of_f32",
                        ("uint32", "float32"): "ub_f32_of_bits"}.get(pair)
            if spelling:
                return f"{spelling}({self.expr(args[0])})"
        if op == "bitwise_not":
            return f"(~{self.expr(args[0])})"
        if op == "shift_right":
            return f"({self.expr(args[0])} >> {self.expr(args[1])})"
        if op == "shift_left":
            return f"({self.expr(args[0])} << {self.expr(args[1])})"
        if is_barrier(e):  # kernels/float_barrier.py: the value as written
            return self.expr(args[1])
        if op in ("call_pure_extern", "call_extern"):
            return f"{args[0].value}({', '.join(self.expr(a) for a in args[1:])})"
        raise CompileError(f"kernel {self.name}: the C printer has no rule for intrinsic {full}")

    def index(self, indices) -> str:
        if len(indices) != 1:
            raise CompileError(f"kernel {self.name}: buffer access not flattened ({indices})")
        return self.expr(indices[0])

    # ---- statements --------------------------------------------------------------------
    def emit(self, line: str):
        self.lines.append("    " * self.indent + line)

    def stmt(self, s):
        t = type(s)
        if t is tirx.SeqStmt:
            if self.in_place:
                self.in_place_sequence(s.seq)
                return
            for child in s.seq:
                self.stmt(child)
        elif t is tirx.For:
            v = self.var(s.loop_var)
            ctype = c_type(dtype_of(s.loop_var))
            lo, ext = self.expr(s.min), self.expr(s.extent)
            end = ext if lo == "0" else f"{lo} + {ext}"
            self.emit(f"for ({ctype} {v} = {lo}; {v} < {end}; ++{v}) {{")
            self.indent += 1
            self.stmt(s.body)
            self.indent -= 1
            self.emit("}")
        elif t is tirx.BufferStore:
            self.written_vars.add(self.buf(s.buffer))
            self.emit(f"{self.buf(s.buffer)}[{self.index(s.indices)}] = {self.expr(s.value)};")
        elif t is tirx.IfThenElse:
            self.emit(f"if ({_unwrapped(self.expr(s.condition))}) {{")
            self.indent += 1
            self.stmt(s.then_case)
            self.indent -= 1
            if s.else_case is not None:
                self.emit("} else {")
                self.indent += 1
                self.stmt(s.else_case)
                self.indent -= 1
            self.emit("}")
        elif t is tirx.Bind:
            v = self.var(s.var)
            self.emit(f"const {c_type(dtype_of(s.var))} {v} = {self.expr(s.value)};")
        elif t is tirx.AllocBuffer:
            self.alloc(s.buffer)
        elif t is tirx.DeclBuffer:
            self.decl(s)
        elif t is tirx.AttrStmt:
            self.stmt(s.body)
        elif t is tirx.Evaluate:
            if not isinstance(s.value, prim.IntImm):
                self.emit(f"(void){self.expr(s.value)};")
        elif t is tirx.AssertStmt:
            pass  # shapes are static; TVM's asserts guard dynamic shapes only
        else:
            raise CompileError(f"kernel {self.name}: the C printer has no rule for TIR "
                               f"{t.__name__}")
        body = getattr(s, "body", None)
        if t in (tirx.AllocBuffer, tirx.DeclBuffer) and body is not None:
            self.stmt(body)

    def in_place_sequence(self, children):
        """A statement sequence of an in-place kernel, where an output may alias an input.

        Each run of consecutive stores (the statements between them are declarations) is
        printed in order, or, where one of its values reads through an output's pointer an
        input that an earlier store of the run overwrote, with every value computed before
        the first store. A value that reads what an earlier store wrote to its own buffer (a
        reduction's init, then its update) needs the order; a run that needs both, or that
        reads an input overwritten before the run, cannot be printed and says so rather than
        print either."""
        earlier, run = [], []

        def flush():
            if not run:
                return
            if self._overwritten_reads(run, earlier)[0]:
                raise CompileError(f"kernel {self.name}: in place, a value reads an input that "
                                   "an earlier statement overwrote; print it out of place")
            aliased, dependent = self._overwritten_reads(run)
            if aliased and dependent:
                raise CompileError(f"kernel {self.name}: in place, a value reads both an input "
                                   "that an earlier store overwrites and what an earlier store "
                                   "wrote; print it out of place")
            if aliased:
                self.stores_after_loads(run)
            else:
                for store in run:
                    self.stmt(store)
            earlier.extend(run)
            run.clear()

        for child in children:
            if type(child) is tirx.BufferStore:
                run.append(child)
                continue
            flush()
            if type(child) is tirx.Bind and earlier and \
                    self._overwritten_reads([child], earlier)[0]:
                raise CompileError(f"kernel {self.name}: in place, a value reads an input that "
                                   "an earlier statement overwrote; print it out of place")
            self.stmt(child)
        flush()

    def _overwritten_reads(self, stores, before=None) -> tuple[bool, bool]:
        """(aliased, dependent): whether a value of `stores` reads, at a pointer that an
        earlier store (of `stores`, or of `before` when given) wrote, an input it aliases, or
        what that store wrote to its own buffer."""
        aliased, dependent = False, False
        for j, store in enumerate(stores):
            try:
                loads = tensor_loads(store.value)
            except UnknownTir:
                raise CompileError(f"kernel {self.name}: an in-place store's value has a node "
                                   "the printer cannot order") from None
            for load in loads:
                for earlier in (stores[:j] if before is None else before):
                    if self.buf(load.source) != self.buf(earlier.buffer):
                        continue
                    if self.storage[load.source] == self.storage[earlier.buffer]:
                        dependent = True
                    else:
                        aliased = True
        return aliased, dependent

    def stores_after_loads(self, stores):
        """Compute every stored value before the first store: in an in-place kernel an output
        aliases an input that a later value of the same element still reads."""
        values = []
        for store in stores:
            name = self.fresh("value")
            ctype = c_type(dtype_of(store.value))
            self.emit(f"const {ctype} {name} = {self.expr(store.value)};")
            values.append(name)
        for store, name in zip(stores, values):
            self.written_vars.add(self.buf(store.buffer))
            self.emit(f"{self.buf(store.buffer)}[{self.index(store.indices)}] = {name};")

    def alloc(self, buffer):
        """An internal buffer becomes a slice of the kernel's scratch argument, or lives in
        an output that is written from it element by element (tir_access.output_reuse)."""
        if buffer in self.reuse:
            self.buffer_names[buffer] = self.buffer_names[self.func.params[self.reuse[buffer]]]
            self.storage[buffer] = self.buffer_names[buffer]
            return
        elements = int(np.prod([int(x) for x in buffer.shape]))
        name = self.fresh(buffer.name)
        self.buffer_names[buffer] = self.storage[buffer] = name
        offset = sum(_aligned_bytes(d, n) for _, d, n in self.scratch)
        self.scratch.append((name, str(buffer.dtype), elements))
        ctype = c_type(buffer.dtype)
        self.emit(f"{ctype} *restrict {name} = ({ctype} *)(ub_scratch + {offset});")

    def decl(self, decl):
        """A view of an existing buffer (FlattenBuffer's 1-D alias) shares its pointer."""
        root = decl.data.args[0] if isinstance(decl.data, ir.Call) else None
        if root is None or root not in self.buffer_names:
            raise CompileError(f"kernel {self.name}: declaration of unknown buffer "
                               f"{decl.buffer.name}")
        self.buffer_names[decl.buffer] = self.buffer_names[root]
        self.storage[decl.buffer] = self.storage[root]


def _unwrapped(text: str) -> str:
    """`text` without the parentheses around all of it (clang warns of `if ((a == b))`)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(text) - 1:
            return text  # "(a) && (b)": the first parenthesis closes early
    return text[1:-1]


def _aligned_bytes(dtype: str, elements: int) -> int:
    nbytes = elements * np.dtype("uint8" if dtype == "bool" else dtype).itemsize
    return (nbytes + 15) // 16 * 16


def print_kernel(func: tirx.PrimFunc, name: str, aliases: dict[int, int] | None = None,
                 reuse_outputs: bool = True) -> CKernel:
    """Print `func` (already lowered) as a C function called `name`.

    With `aliases` ({input index: output index}), the kernel is called with each such
    output at the address of its input (element by element, in place): the input is read
    through the output's pointer, so every pointer stays `restrict` and the compiler, which
    sees one base, still vectorises; and each element's values are all computed before any
    is stored."""
    aliases = aliases or {}
    p = _Printer(func, name, in_place=bool(aliases), reuse_outputs=reuse_outputs)
    params = []
    for buffer in func.params:
        if not isinstance(buffer.ty, tirx.BufferType):
            raise CompileError(f"kernel {name}: scalar parameter {buffer.name} is not supported")
        cname = p.fresh(buffer.name)
        p.buffer_names[buffer] = p.storage[buffer] = cname
        elements = int(np.prod([int(x) for x in buffer.shape]))
        params.append((cname, str(buffer.dtype), elements, cname))
    for k, o in aliases.items():
        p.buffer_names[func.params[k]] = params[o][0]
    p.stmt(func.body)
    written = {i for i, (_, _, _, cname) in enumerate(params) if cname in p.written_vars}
    args = ["uint8_t *restrict ub_scratch"]
    for i, (cname, dtype, _, _) in enumerate(params):
        const = "" if i in written else "const "
        args.append(f"{const}{c_type(dtype)} *restrict {cname}")
    attributes = "UB_KERNEL UB_NO_LOOP_VECTORIZE" if p.loads_on_both_sides else "UB_KERNEL"
    header = f"{attributes} int32_t {name}({', '.join(args)})"
    unused = "    (void)ub_scratch;\n" if not p.scratch else ""
    unused += "".join(f"    (void){params[k][0]};  /* read through {params[o][0]} */\n"
                      for k, o in sorted(aliases.items()))
    source = header + " {\n" + unused + "\n".join(p.lines) + "\n    return UB_OK;\n}\n"
    scratch = sum(_aligned_bytes(d, n) for _, d, n in p.scratch)
    return CKernel(
        name=name,
        source=source,
        params=[(c, d, n) for c, d, n, _ in params],
        written=written,
        scratch_bytes=scratch,
        unread=frozenset(aliases),
    )
