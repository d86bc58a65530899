"""From the Relax training module to the two step programs, `train_step` and `predict`.

Relax ops are legalized into TIR PrimFuncs (each printed once into the kernel library);
`relax.reshape` is kept out of legalization and becomes a view that shares its source's
storage. The training program then gets what Relax does not express: Dropout masks drawn at
the start, a check that the loss is finite before anything is written, the new BatchNorm
buffers copied back, and one in-place optimizer update per trainable parameter, placed right
after the last use of that parameter and its gradient (TinyEngine's early update). Last,
elementwise kernels write over an input that dies at the call (in-place sharing).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from ..errors import CompileError
from ..kernels import microkernels
from ..kernels.library import KernelLibrary
from ..ops.tagging import tagging_legalizations
from ..lowering.fused_kernels import legalize_fused_ops
from ..lowering.fusion import fuse_kernels
from ..lowering.reductions import reduction_legalizations
from ..lowering.transposed_matmul import fold_weight_transposes
from ..training.graph import TrainingModule
from .bn_activation import fuse_bn_activation_grads
from .depthwise_input import read_depthwise_inputs_in_place
from .inplace import share_in_place
from .ir import Call, Program, Slot, users
from .micro_batch import loop_calls, micro_slices, shadow_of, whole_batch
from .passes import ALL_ON, Passes
from .pool_relu import fuse_pool_relu_grads
from .update_epilogue import fuse_update_epilogues


def legalize(mod: tvm.IRModule, accumulate_dtype: str = "float32",
             switches: Passes = ALL_ON) -> tvm.IRModule:
    custom = {"relax.reshape": lambda bb, call: call}  # kept as a view, never a kernel
    custom.update(tagging_legalizations())  # conv/matmul PrimFuncs remember their op
    if accumulate_dtype != "float32":
        custom.update(reduction_legalizations(accumulate_dtype))
    mod = legalize_fused_ops(mod, accumulate_dtype)  # fused BatchNorm, cross-entropy
    if switches.on("fold_weight_transposes"):
        mod = fold_weight_transposes(mod)  # x @ W.T without a copy of W.T
    mod = relax.transform.LegalizeOps(customize_legalize_map=custom)(mod)
    return relax.transform.DeadCodeElimination(["main", "predict"])(mod)


class _FunctionWalker:
    """Turns the bindings of one legalized Relax function into calls over slots."""

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


def _state_slots(tm: TrainingModule, optimizer):
    """(state slots by name, optimizer state slots by trained name, the parts of weights
    trained by channels as views into their weight's slot, by part name)."""
    state = {}
    for s in tm.predict_graph.state:  # the model's state, whole
        kind = "parameter" if s.is_parameter else "buffer"
        state[s.name] = Slot(_c(s.name), s.value.shape, str(s.value.dtype), kind, s.value,
                             label=s.name)
    parts = {}
    for split in (s for s in tm.channel_splits if s.partial):
        whole = state[split.param]
        row_bytes = whole.nbytes // split.channels
        for name, start, stop in ((split.trained_name, 0, split.trained),
                                  (split.frozen_name, split.trained, split.channels)):
            parts[name] = Slot(_c(name), (stop - start,) + whole.shape[1:], whole.dtype,
                               "parameter", view_of=whole, offset=start * row_bytes, label=name)
    opt_state = {}
    for name in tm.trainable:
        p = parts.get(name) or state[name]
        opt_state[name] = [
            Slot(_c(f"{name}.{st}"), p.shape, p.dtype, "optimizer_state",
                 np.zeros(p.shape, p.dtype), label=f"{name}.{st}")
            for st in optimizer.state_names
        ]
    return state, opt_state, parts


def build_programs(tm: TrainingModule, optimizer, library: KernelLibrary,
                   accumulate_dtype: str = "float32", switches: Passes = ALL_ON):
    """Return (train_step, predict, state slots, optimizer state slots, io slots);
    `switches` says which rewrite passes run (program/passes.py)."""
    mod = legalize(tm.mod, accumulate_dtype, switches)
    if switches.on("fuse_kernels"):  # kernels with a micro-kernel here stay whole, to match it
        mod = fuse_kernels(mod, lambda f: microkernels.plan(f, library.isa) is not None)
    state, opt_state, parts = _state_slots(tm, optimizer)
    g = tm.graph
    k = tm.micro_batches  # > 1: the functions run on B/k samples (program/micro_batch.py)
    inputs = [Slot(spec.name, whole_batch(spec.shape, k), spec.dtype, "input",
                   index_bound=spec.index_bound)
              for spec in g.input_specs]  # the whole batch: the C API
    labels = Slot("labels", tm.labels_shape, tm.labels_dtype, "label")
    step_io = inputs + [labels]
    if k > 1:
        step_io = micro_slices(step_io, [s.shape for s in g.input_specs]
                               + [(tm.labels_shape[0] // k,) + tm.labels_shape[1:]])

    # ---- train_step -------------------------------------------------------------------------
    train_fn = mod["main"]
    # With micro-batches, BatchNorm's running statistics go through shadows copied back
    # after the loop, so that a non-finite loss in any micro-batch leaves the state as it was.
    shadows = {n: shadow_of(state[n]) for n in tm.buffer_updates} if k > 1 else {}
    train_state = [shadows.get(s.name) or parts.get(s.name) or state[s.name] for s in g.state]
    env = dict(zip(train_fn.params, step_io + train_state))
    walker = _FunctionWalker(mod, library, env, "tr_")
    # Random masks (Dropout, bernoulli_) are the function's last parameters; the runtime
    # draws them first.
    masks = []
    mask_params = train_fn.params[len(train_fn.params) - len(g.random_masks):]
    for mask, param in zip(g.random_masks, mask_params):
        env[param] = walker.new_slot(mask.var.ty, "mask", "mask")
        masks.append(Call("ub_dropout_mask", [env[param]], [0], builtin=True,
                          attrs={"p": mask.p, "scale": mask.scale}))
    result = walker.walk(train_fn)
    forward_outputs, grads = (result, []) if not tm.trainable else result
    forward_outputs = forward_outputs if isinstance(forward_outputs, list) else [forward_outputs]
    loss, new_buffers = forward_outputs[0], forward_outputs[1:]
    calls = masks + walker.calls
    loss_at = _last_write(calls, loss)
    for call in calls[loss_at + 1:]:  # the backward pass: gradients and their temporaries
        for slot in call.writes:
            if slot.root.kind == "activation":
                slot.root.kind = "gradient"
    loss_out = Slot("loss", (), "float32", "output")
    calls.insert(loss_at + 1, Call("ub_check_loss", [loss], [], builtin=True))
    for name, new in zip(tm.buffer_updates, new_buffers):
        calls.append(Call("ub_copy", [new, shadows.get(name, state[name])], [1], builtin=True))
    if k > 1:  # the calls so far run once per micro-batch
        calls, grads, loss = loop_calls(calls, grads, loss, k, zip(step_io, inputs + [labels]),
                                        library, [(shadows[n], state[n]) for n in shadows])
    coef_call, updates = _optimizer_calls(tm, optimizer, library, state, parts, opt_state,
                                          grads)
    if coef_call:  # after the loop, the update reads every micro-batch's parameters
        early = k == 1 and switches.on("early_updates")
        calls = [coef_call] + (_place_early(calls, updates) if early else calls + updates)
        if early and switches.on("update_epilogues"):
            calls = fuse_update_epilogues(calls, library, lambda n: _block_update_kernel(
                optimizer, library, n, len(opt_state[tm.trainable[0]]), calls[0].args[0]))
    if k == 1 and switches.on("pool_relu_grads"):
        calls = fuse_pool_relu_grads(calls, library)
    if k == 1 and switches.on("bn_activation_grads"):
        calls = fuse_bn_activation_grads(calls, library)
    if k == 1 and switches.on("depthwise_inputs_in_place"):
        calls = read_depthwise_inputs_in_place(calls, library)
    calls.append(Call("ub_copy", [loss, loss_out], [1], builtin=True))
    # Every state tensor keeps its bytes, also one that no call reads (an unused layer's).
    train = Program("train_step", calls, held=list(state.values()))

    # ---- predict ----------------------------------------------------------------------------
    pred_fn = mod["predict"]
    pg = tm.predict_graph
    if pg.random_masks:
        raise CompileError(
            f"the model draws {len(pg.random_masks)} random mask(s) in evaluation mode too "
            "(F.dropout(..., training=True) or a bernoulli_ whatever self.training is); "
            "predict has no random draws: pass training=self.training")
    pred_inputs = inputs if k == 1 else micro_slices(inputs, [s.shape for s in g.input_specs])
    penv = dict(zip(pred_fn.params, pred_inputs + [state[s.name] for s in pg.state]))
    pwalker = _FunctionWalker(mod, library, penv, "pr_")
    out = pwalker.walk(pred_fn)
    if k > 1 and (not out.shape or out.shape[0] != g.input_specs[0].shape[0]):
        raise CompileError(f"micro_batches={k} needs the model output's first dimension to be "
                           f"the batch, got output shape {list(out.shape)} for a micro-batch "
                           f"of {g.input_specs[0].shape[0]}; use micro_batches=1")
    output = Slot("output", whole_batch(out.shape, k), out.dtype, "output")
    pred_out = output if k == 1 else micro_slices([output], [out.shape])[0]
    predict = Program("predict", pwalker.calls + [Call("ub_copy", [out, pred_out], [1],
                                                       builtin=True)])
    if k > 1:  # each micro-batch's rows of the output (evaluation mode: nothing couples them)
        predict.calls = loop_calls(predict.calls, [], None, k, zip(pred_inputs + [pred_out],
                                                                   inputs + [output]), library)[0]
    # Elementwise kernels overwrite an input that dies at the call (program/inplace.py).
    if switches.on("share_in_place"):
        train.in_place_bytes = share_in_place(train, library)
        predict.in_place_bytes = share_in_place(predict, library)
    return train, predict, state, opt_state, inputs, labels, output


def _optimizer_calls(tm, optimizer, library, state, parts, opt_state, grads):
    if not tm.trainable:
        return None, []
    coef_code = optimizer.coefficient_code()
    coef = Slot("optimizer_coefficients", (len(coef_code),), "float32", "coefficients",
                np.zeros(len(coef_code), "float32"))
    coef_call = Call("ub_optimizer_coefficients", [coef], [0], builtin=True,
                     attrs={"code": coef_code})
    updates = []
    for name, grad in zip(tm.trainable, grads):
        param, states = parts.get(name) or state[name], opt_state[name]
        func = _update_prim_func(optimizer, param.shape, len(states), coef)
        # In place: the new parameter and state overwrite the old, element by element.
        kernel = library.add(func, f"{type(optimizer).__name__.lower()}_update",
                             _update_aliases(len(states)))
        args = [param, grad] + states + [coef, param] + states
        updates.append(Call(kernel.name, args, sorted(kernel.written), attrs={"param": name}))
    return coef_call, updates


def _place_early(calls: list[Call], updates: list[Call]) -> list[Call]:
    """Insert each update just after the last use of its parameter and its gradient, so
    that gradients of the whole model never need to coexist (TinyEngine's in-place update)."""
    merged = list(calls)
    for upd in updates:
        param, grad = upd.args[0], upd.args[1]
        merged.insert(max(_last_use(merged, param.root), _last_use(merged, grad.root)) + 1, upd)
    return merged


def _block_update_kernel(optimizer, library, elements: int, n_states: int, coef):
    """The update kernel over `elements` consecutive elements (a block of weight rows)."""
    func = _update_prim_func(optimizer, (elements,), n_states, coef)
    return library.add(func, f"{type(optimizer).__name__.lower()}_update",
                       _update_aliases(n_states))


def _update_aliases(n_states: int) -> dict[int, int]:
    """Arguments [param, grad] + states + [coef, param] + states: the new parameter and
    states are written over the old."""
    return {0: 3 + n_states} | {2 + j: 4 + n_states + j for j in range(n_states)}


def _update_prim_func(optimizer, shape, n_states: int, coef):
    p = te.placeholder(shape, "float32", "param")
    g = te.placeholder(shape, "float32", "grad")
    st = [te.placeholder(shape, "float32", f"state{i}") for i in range(n_states)]
    c = te.placeholder(coef.shape, "float32", "coef")
    out = optimizer.update(p, g, st, c)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return te.create_prim_func([p, g] + st + [c] + outs)


def _last_write(calls, slot) -> int:
    return max(i for i, c in enumerate(calls) if any(w.root is slot.root for w in c.writes))


def _last_use(calls, root) -> int:
    return max(users(calls, root), default=-1)


def _c(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)
