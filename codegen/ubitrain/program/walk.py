"""A legalized Relax function walked into kernel calls over slots.

Each `R.call_tir` binding becomes one call of the step program, its PrimFunc printed once
into the kernel library; a `relax.reshape` becomes a view that shares its source's storage;
a constant becomes a constant slot.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import CompileError
from ..kernels.library import KernelLibrary
from .ir import Call, Slot


class FunctionWalker:
    """Turns the bindings of one legalized Relax function into calls over slots; `env`
    maps the function's parameters (and then every bound var) to slots."""

    def __init__(self, mod, library: KernelLibrary, env: dict, prefix: str):
        self.mod, self.library, self.env, self.prefix = mod, library, env, prefix
        self.calls: list[Call] = []
        self.counter = 0

    def new_slot(self, ty, kind="activation", hint="t") -> Slot:
        self.counter += 1
        shape = tuple(int(d) for d in ty.shape)
        return Slot(f"{self.prefix}{hint}{self.counter}", shape, str(ty.dtype), kind)

    def value(self, expr):
        if isinstance(expr, relax.Var):
            return self.env[expr]
        if isinstance(expr, (tvm.ir.Constant, tvm.ir.GenericConst)):
            data = expr.value.numpy()
            self.counter += 1
            return Slot(f"const{self.counter}", data.shape, str(data.dtype), "constant", data)
        if isinstance(expr, relax.Tuple):
            return [self.value(f) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            return self.value(expr.tuple_value)[expr.index]
        raise CompileError(f"unexpected Relax expression {type(expr).__name__} in the step graph")

    def walk(self, func: relax.Function):
        for block in func.body.blocks:
            for binding in block.bindings:
                self.env[binding.var] = self.binding(binding)
        return self.value(func.body.body)

    def binding(self, binding):
        v = binding.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
            if v.op.name == "relax.call_tir":
                return self.call_tir(binding.var, v)
            if v.op.name == "relax.reshape":
                src = self.value(v.args[0])
                self.counter += 1
                ty = binding.var.ty
                return Slot(f"{src.name}_v{self.counter}", tuple(int(d) for d in ty.shape),
                            str(ty.dtype), src.kind, view_of=src)
            raise CompileError(f"Relax op {v.op.name} was not legalized into a kernel")
        return self.value(v)

    def call_tir(self, var, call):
        gvar, args = call.args[0], self.value(call.args[1])
        func = self.mod[gvar]
        kernel = self.library.add(func, gvar.name_hint)
        ty = var.ty
        outs = ([self.new_slot(t) for t in ty.fields] if isinstance(ty, relax.TupleType)
                else [self.new_slot(ty)])
        self.append(kernel, list(args) + outs)
        return outs if isinstance(ty, relax.TupleType) else outs[0]

    def append(self, kernel, args):
        if len(args) != len(kernel.params):
            raise CompileError(f"kernel {kernel.name} takes {len(kernel.params)} tensors, "
                               f"the graph passes {len(args)}")
        scratch = None
        if kernel.scratch_bytes:
            scratch = Slot(f"scratch{len(self.calls)}_{self.prefix}", (kernel.scratch_bytes,),
                           "uint8", "scratch")
        self.calls.append(Call(kernel.name, args, sorted(kernel.written), scratch=scratch))
