"""The float32 pipeline: every step of a compile, in order.

Lowering (run once per number of micro-batches k):
    trace                      the model traced, its loss appended, differentiated (Relax)
    kernel_library             where each kernel is printed once
      microkernels *           conv, matmul, BatchNorm, pooling from the ISA's templates
      output_reuse *           a fused kernel's intermediate kept in its output buffer
    legalize_fused_ops         fused BatchNorm and cross-entropy as TIR
      fold_weight_transposes * x @ W.T reads W as stored
    legalize                   every other Relax op as a TIR PrimFunc
      fuse_kernels *           elementwise chains, epilogues and producers fused
    state_slots                parameters, buffers, optimizer state
    train_calls                the training function walked into calls
    micro_batch_loop           with k > 1, the calls as a loop body with accumulation
    optimizer_updates          one in-place update per trained parameter
      early_updates *          each update right after its last use
      update_epilogues *       the update in a matmul weight gradient's epilogue
      pool_relu_grads *        max-pool and ReLU gradients as one in-place kernel
      bn_activation_grads *    BatchNorm's backward takes the activation's mask in
      depthwise_inputs_in_place *  the depthwise weight gradient reads x as stored
    finish_train               the train_step program
    predict                    the evaluation-mode forward
      share_in_place *         elementwise outputs over inputs that die there
    frozen_state_in_flash      on a board: state no step writes as const data in flash
      fold_frozen_calls *      kernels over frozen weights evaluated at compile time
    plan_memory                one arena: persistent state, then each program's buffers
Finishing (once):
    fit_memory_budget          recompute, page or micro-batch to fit a budget
    check_board                the plan against the board's SRAM and flash
    write_project              the C project

(* a rewrite: `disable_passes` switches it off by name; each states its precondition.)
"""

from __future__ import annotations

from ..errors import CompileError
from ..kernels import microkernels
from ..kernels.library import KernelLibrary
from ..lowering.fused_kernels import legalize_fused_ops
from ..lowering.fusion import fuse_kernels
from ..lowering.legalize import legalize_ops
from ..lowering.transposed_matmul import fold_weight_transposes
from ..memory.micro_batching import fit_micro_batched
from ..memory.plan import plan_memory
from ..optim import OPTIMIZERS, SGD
from ..package import Package
from ..program.bn_activation import fuse_bn_activation_grads
from ..program.depthwise_input import read_depthwise_inputs_in_place
from ..program.frozen_state import fold_frozen_calls, keep_frozen_state_in_flash
from ..program.gradient_clipping import clip_call
from ..program.inplace import share_in_place
from ..program.ir import Call, Program, Slot
from ..program.micro_batch import has_loop, loop_calls
from ..program.optimizer_update import (
    block_update_kernel,
    clip_norm,
    optimizer_calls,
    place_early,
)
from ..program.pool_relu import fuse_pool_relu_grads
from ..program.predict_step import predict_program
from ..program.state_slots import state_slots
from ..program.train_step import step_io, train_calls
from ..program.update_epilogue import fuse_update_epilogues
from ..project.emit import render_project
from ..project.manifest import write_manifest
from ..targets import check_board_fit
from ..training.batch_coupling import (
    batch_coupled_layers,
    one_batch_dimension,
    warn_batch_coupled,
)
from ..training.graph import build_training_module
from .request import example_batch
from .steps import Pipeline, Rewrite, Step

TRACE, LOWER, PLAN, WRITE = ("trace and differentiate", "lower kernels", "plan memory",
                             "write C project")


# ---- preconditions -------------------------------------------------------------------------

def no_micro_batch_loop(unit) -> str | None:
    """A rewrite of neighbouring calls: the calls of a micro-batch loop run k times, and
    what it fuses across the loop's edges would not."""
    return "the step runs a micro-batch loop" if has_loop(unit.calls) else None


def float32_microkernels(unit) -> str | None:
    if unit.target.kernel_isa("float32") == "scalar":
        return f"target {unit.target.name} has no float32 micro-kernels"
    return None


def state_in_flash(unit) -> str | None:
    if not unit.target.frozen_state_in_flash:
        return f"target {unit.target.name} keeps no state in flash"
    return None


# ---- lowering --------------------------------------------------------------------------------

def trace(unit, converters=None):
    r, k = unit.request, unit.micro_batches
    try:
        unit.tm = build_training_module(r.model, r.example_inputs, r.labels, r.loss,
                                        r.trainable, k, converters)
    except CompileError as err:
        if k == 1:
            raise
        raise CompileError(f"micro_batches={k} traces the model on micro-batches of "
                           f"{r.batch // k} samples, which failed: {err} Use "
                           f"micro_batches=1, or a model that takes any batch size") from None


def kernel_library(unit):
    unit.library = KernelLibrary("scalar", reuse_outputs=False)


def use_microkernels(unit):
    unit.library.isa = unit.target.kernel_isa("float32")


def reuse_outputs(unit):
    unit.library.reuse_outputs = True


def fused_ops_as_tir(unit):
    unit.mod = legalize_fused_ops(unit.tm.mod, unit.target.accumulate_dtype)


def weight_transposes_folded(unit):
    unit.mod = fold_weight_transposes(unit.mod)


def legalize(unit):
    unit.mod = legalize_ops(unit.mod, unit.target.accumulate_dtype)


def fused_kernels(unit):
    # kernels with a micro-kernel here stay whole, to match it
    isa = unit.library.isa
    unit.mod = fuse_kernels(unit.mod, lambda f: microkernels.plan(f, isa) is not None)


def slots_of_state(unit):
    unit.state, unit.opt_state, unit.parts = state_slots(unit.tm, unit.request.optimizer)


def walk_train(unit):
    unit.inputs, unit.labels, unit.step_io = step_io(unit.tm)
    unit.calls, unit.grads, unit.loss, unit.shadows = train_calls(
        unit.mod, unit.tm, unit.library, unit.state, unit.parts, unit.step_io)


def micro_batch_loop(unit, sums=None):
    """`sums`: how the gradients add up (program/micro_batch.py loop_calls; the mean)."""
    if unit.micro_batches == 1:
        return
    state = unit.state
    unit.calls, unit.grads, unit.loss = loop_calls(
        unit.calls, unit.grads, unit.loss, unit.micro_batches,
        zip(unit.step_io, unit.inputs + [unit.labels]), unit.library,
        [(unit.shadows[n], state[n]) for n in unit.shadows], sums)


def add_optimizer_updates(unit):
    coef_call, unit.updates = optimizer_calls(unit.tm, unit.request.optimizer, unit.library,
                                              unit.state, unit.parts, unit.opt_state,
                                              unit.grads)
    if coef_call:  # after a micro-batch loop: the update reads every micro-batch's work
        max_norm = clip_norm(unit.request.optimizer)
        clip = [clip_call(unit.grads, coef_call.args[0], max_norm)] if max_norm else []
        unit.calls = [coef_call] + unit.calls + clip + unit.updates


def has_updates(unit) -> str | None:
    return no_micro_batch_loop(unit) or (None if unit.updates else "nothing trains")


def updates_early(unit):
    body = [c for c in unit.calls[1:] if c not in unit.updates]
    unit.calls = unit.calls[:1] + place_early(body, unit.updates)


def update_epilogues(unit):
    calls, optimizer = unit.calls, unit.request.optimizer
    states = len(unit.opt_state[unit.tm.trainable[0]])
    coef = calls[0].args[0]  # the coefficients call comes first
    unit.calls = fuse_update_epilogues(calls, unit.library, lambda n: block_update_kernel(
        optimizer, unit.library, n, states, coef))


def pool_relu_grads(unit):
    unit.calls = fuse_pool_relu_grads(unit.calls, unit.library)


def bn_activation_grads(unit):
    unit.calls = fuse_bn_activation_grads(unit.calls, unit.library)


def depthwise_inputs(unit):
    unit.calls = read_depthwise_inputs_in_place(unit.calls, unit.library)


def finish_train(unit):
    loss_out = Slot("loss", (), "float32", "output")
    calls = unit.calls + [Call("ub_copy", [unit.loss, loss_out], [1], builtin=True)]
    # Every state tensor keeps its bytes, also one that no call reads (an unused layer's).
    unit.train = Program("train_step", calls, held=list(unit.state.values()))


def walk_predict(unit):
    unit.predict, unit.output = predict_program(unit.mod, unit.tm, unit.library, unit.inputs,
                                                unit.state)


def in_place(unit):
    unit.train.in_place_bytes = share_in_place(unit.train, unit.library)
    unit.predict.in_place_bytes = share_in_place(unit.predict, unit.library)


def frozen_in_flash(unit):
    if unit.target.frozen_state_in_flash:
        unit.frozen = keep_frozen_state_in_flash([unit.train, unit.predict], unit.state)


def fold_frozen(unit):
    unit.folded_bytes = fold_frozen_calls([unit.train, unit.predict], unit.library)


def memory_plan(unit):
    unit.plan = plan_memory([unit.train, unit.predict], alignment=unit.target.alignment)


# ---- finishing -------------------------------------------------------------------------------

def fit_memory_budget(unit):
    """Keep, recompute, page or micro-batch to fit `memory_budget` (memory/); the unit may
    be lowered again at another number of micro-batches."""
    r = unit.request
    coupled = None  # the layers that couple samples: a float64 probe, run once
    if r.memory_budget is not None:
        coupled = batch_coupled_layers(r.model, unit.tm, r.example_inputs)
        unit, unit.train, unit.plan = fit_micro_batched(
            unit, unit.lower, r.memory_budget, r.target, r.batch, r.micro_batches,
            bool(coupled), one_batch_dimension(r.example_inputs, r.labels))
    if unit.tm.micro_batches > 1:
        warn_batch_coupled(coupled if coupled is not None else
                           batch_coupled_layers(r.model, unit.tm, r.example_inputs),
                           unit.tm.micro_batches, r.batch)
    return unit


def check_board(unit):
    check_board_fit(unit.target, unit.plan, unit.inputs, unit.labels, unit.output,
                    weight_bytes=sum(s.nbytes for s in unit.state.values())
                    + unit.folded_bytes)


def _classes(unit) -> int | None:
    return unit.output.shape[-1] if unit.request.loss == "cross_entropy" else None


def project(unit, train=None, sources=()):
    """The C project of `unit` (`train`: a step that replaces unit.train, such as a split
    step's CPU part, with `sources` defining what it calls beyond the library's kernels)."""
    r, library, train = unit.request, unit.library, train or unit.train
    called = {c.kernel for prog in (train, unit.predict) for c in prog.calls}
    render_project(r.out_dir, r.name, train, unit.predict, unit.plan,
                   library.sources(called) + list(sources), unit.state, unit.opt_state,
                   unit.tm.trainable,
                   unit.inputs, unit.labels, unit.output, _classes(unit), unit.frozen,
                   library.unread_arguments(), list(library.support.values()),
                   target=r.target, trace_calls=unit.trace_calls,
                   example_batch=example_batch(r))


def package(unit):
    r, tm = unit.request, unit.tm
    unit.package = Package(
        out_dir=r.out_dir, model_name=r.name, target=r.target, memory_plan=unit.plan,
        inputs=unit.inputs, labels=unit.labels, output=unit.output, classes=_classes(unit),
        trainable=tm.trainable, programs={"train_step": unit.train, "predict": unit.predict},
        kernel_count=len(unit.library.kernels), frozen_in_flash=list(unit.frozen),
        aliases=tm.graph.aliases(), skipped_passes=dict(unit.skipped),
        pages=paged_tensors(unit))
    write_manifest(unit.package)  # package.json: the project loads without this process


def paged_tensors(unit) -> int:
    """Tensors the step pages out: the trainer gives it storage when there are any."""
    return sum(c.kernel == "ub_page_out" for c in unit.train.calls)


def checked_optimizer(optimizer):
    optimizer = optimizer if optimizer is not None else SGD()
    if not isinstance(optimizer, OPTIMIZERS):
        raise CompileError(f"optimizer must be ub.SGD, ub.Adam or ub.AdamW, got "
                           f"{type(optimizer).__name__}")
    return optimizer


def check_options(loss, micro_batches):
    """Every loss and micro-batch count has a float32 form."""


FP32 = Pipeline(
    "fp32",
    lowering=(
        Step("trace", trace, "the model traced, its loss appended and differentiated "
             "(training/graph.py)", phase=TRACE),
        Step("kernel_library", kernel_library, "the kernels, each printed once "
             "(kernels/library.py)", phase=LOWER),
        Rewrite("microkernels", use_microkernels, "conv, matmul, BatchNorm and pooling kernels "
                "from the ISA's templates (kernels/microkernels/) instead of printed TIR",
                requires=float32_microkernels, bit_exact=False),
        Rewrite("output_reuse", reuse_outputs, "a fused kernel's intermediate kept in its "
                "output buffer (kernels/tir_access.py)"),
        Step("legalize_fused_ops", fused_ops_as_tir, "fused BatchNorm and cross-entropy as "
             "TIR (lowering/fused_kernels.py)"),
        Rewrite("fold_weight_transposes", weight_transposes_folded, "a Linear layer reads its "
                "weight as stored (lowering/transposed_matmul.py), no transposed copy",
                bit_exact=False),
        Step("legalize", legalize, "every other Relax op as a TIR PrimFunc "
             "(lowering/legalize.py)"),
        Rewrite("fuse_kernels", fused_kernels, "elementwise chains, epilogues and injective "
                "producers fused into one kernel (lowering/fusion.py)"),
        Step("state_slots", slots_of_state, "parameters, buffers and optimizer state as slots "
             "(program/state_slots.py)"),
        Step("train_calls", walk_train, "the training function walked into calls "
             "(program/train_step.py)"),
        Step("micro_batch_loop", micro_batch_loop, "with k > 1 micro-batches, the calls as a "
             "loop body with gradient accumulation (program/micro_batch.py)"),
        Step("optimizer_updates", add_optimizer_updates, "one in-place update per trained "
             "parameter (program/optimizer_update.py)"),
        Rewrite("early_updates", updates_early, "each optimizer update right after the last "
                "use of its parameter and gradient (program/optimizer_update.py)",
                requires=has_updates),
        Rewrite("update_epilogues", update_epilogues, "the optimizer update in the epilogue "
                "of a matmul weight gradient (program/update_epilogue.py)",
                after=("early_updates",)),
        Rewrite("pool_relu_grads", pool_relu_grads, "the max-pool gradient and the ReLU "
                "gradient as one in-place kernel (program/pool_relu.py)",
                requires=no_micro_batch_loop),
        Rewrite("bn_activation_grads", bn_activation_grads, "BatchNorm's backward takes in "
                "the activation's gradient mask (program/bn_activation.py)",
                requires=no_micro_batch_loop),
        Rewrite("depthwise_inputs_in_place", depthwise_inputs, "the depthwise weight gradient "
                "reads x as stored (program/depthwise_input.py)", requires=no_micro_batch_loop),
        Step("finish_train", finish_train, "the train_step program: the loss copied out"),
        Step("predict", walk_predict, "the evaluation-mode forward (program/predict_step.py)"),
        Rewrite("share_in_place", in_place, "an elementwise kernel writes over an input that "
                "dies there (program/inplace.py)"),
        Step("frozen_state_in_flash", frozen_in_flash, "on targets whose flash and SRAM are "
             "distinct, state no step writes as const data (program/frozen_state.py)"),
        Rewrite("fold_frozen_calls", fold_frozen, "kernels over frozen weights evaluated at "
                "compile time, on targets that keep frozen state in flash "
                "(program/frozen_state.py)", requires=state_in_flash),
        Step("plan_memory", memory_plan, "one arena: persistent state, then each program's "
             "buffers over their lifetimes (memory/plan.py)", phase=PLAN),
    ),
    finishing=(
        Step("fit_memory_budget", fit_memory_budget, "keep, recompute, page or micro-batch "
             "to fit memory_budget (memory/budget.py, memory/micro_batching.py)"),
        Step("check_board", check_board, "the plan against the board's SRAM and flash "
             "(targets/fit.py)"),
        Step("write_project", project, "model.h, model.c, CMakeLists.txt, runtime_c "
             "(project/emit.py)", phase=WRITE),
        Step("package", package, "what the compile tells its caller (package.py), and "
             "package.json for a copy of the project (project/manifest.py)"),
    ),
    check_options=check_options,
    checked_optimizer=checked_optimizer,
)
