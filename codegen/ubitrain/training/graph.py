"""Build the Relax training module: forward in training mode, loss, and gradients.

The training function returns `((loss, new buffer values...), (gradients...))`; the
optimizer update is added later, in the step program, as in-place kernels. Parameters that
do not train get no gradient, and Relax's Gradient pass then drops every backward op that
only fed them (a fused op's backward too: training/unread_gradients.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..errors import CompileError
from ..frontend.forward import ForwardGraph
from ..frontend.onnx_import import import_onnx, is_onnx_model
from ..frontend.torch_export import import_forward
from ..ops.gradients import register_gradients
from .batch_coupling import frequency_scaled_embeddings
from .channel_split import ChannelSplit, plan_splits, split_channels
from .losses import append_loss, label_spec, labels_var
from .sparse_update import SparseUpdate
from .unread_gradients import drop_unread_weight_gradients


@dataclass
class TrainingModule:
    mod: tvm.IRModule  # "main": the training step (after Gradient), "predict": eval forward
    graph: ForwardGraph
    predict_graph: ForwardGraph
    labels_shape: tuple[int, ...]
    labels_dtype: str
    trainable: list[str]
    buffer_updates: list[str]  # state names, in the order of the training outputs
    channel_splits: list[ChannelSplit] = field(default_factory=list)  # weights trained in part
    micro_batches: int = 1  # the functions run on batch / micro_batches samples (labels: all)


def resolve_trainable(graph: ForwardGraph, trainable, reach_loss: set[str]) -> list[str]:
    """The parameters that train: those `trainable` selects (None: all) that require a
    gradient, less those the loss does not depend on, which PyTorch leaves alone too (no
    gradient, so its optimizers skip them: no weight decay, no momentum). A tied parameter
    is selected by any of its names and trains once, under its first."""
    aliases = graph.aliases()
    params = {s.name: s for s in graph.state if s.is_parameter}
    names = [n for n in graph.state_names or params if aliases.get(n, n) in params]
    if trainable is None:
        chosen = list(params)
    elif isinstance(trainable, SparseUpdate):
        chosen = trainable.select(names)  # a rule: it skips frozen parameters, as PyTorch
    else:
        if isinstance(trainable, str):
            trainable = [trainable]
        unknown = [t for t in trainable if t not in names]
        if unknown:
            raise CompileError(f"trainable names {unknown} are not parameters of the model; "
                               f"its parameters are: {', '.join(names)}")
        frozen = [t for t in trainable if not params[aliases.get(t, t)].requires_grad]
        if frozen:
            raise CompileError(f"trainable names {frozen}, which have requires_grad=False: "
                               "PyTorch would not train them. Call requires_grad_(True) on "
                               "them or leave them out of trainable")
        chosen = trainable
    chosen = {aliases.get(n, n) for n in chosen}
    return [p for p, s in params.items() if p in chosen and s.requires_grad and p in reach_loss]


def state_reaching_loss(func: relax.Function, graph: ForwardGraph) -> set[str]:
    """Names of the state tensors that the function's first output (the loss) reads."""
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    loss = func.body.body.fields[0] if isinstance(func.body.body, relax.Tuple) else func.body.body
    seen, todo = set(), [loss]
    while todo:
        var = todo.pop()
        if var in seen:
            continue
        seen.add(var)
        if var in values:
            todo.extend(relax.analysis.free_vars(values[var]))
    return {name for name, var in graph.state_vars.items() if var in seen}


def _model_order(graph: ForwardGraph, names: list[str], splits) -> list[str]:
    """The trained names with each split weight's trained part where the weight would be."""
    trained = set(names) | {s.trained_name for s in splits}
    return [s.name for s in graph.state if s.name in trained]


def _adjoint_as_main(mod: tvm.IRModule) -> tvm.IRModule:
    """Keep every function (kernels that gradient rules emitted included) under its own
    GlobalVar, with the differentiated step as "main"."""
    out = tvm.IRModule()
    for gvar, func in mod.functions.items():
        if gvar.name_hint == "main_adjoint":
            out["main"] = func
        elif gvar.name_hint != "main":
            out[gvar] = func
    return out


def build_training_module(model, example_inputs: tuple, labels, loss: str,
                          trainable=None, micro_batches: int = 1,
                          converters=None) -> TrainingModule:
    """`micro_batches` = k traces both functions on the first batch / k samples (the step
    programs run them k times over the whole batch, program/micro_batch.py). `converters`:
    {ATen op: converter} in place of the float ones."""
    register_gradients()
    splits: list[ChannelSplit] = []
    labels_shape = tuple(labels.shape)
    train_inputs = example_inputs
    scaled = frequency_scaled_embeddings(model) if micro_batches > 1 else []
    if scaled:
        raise CompileError(f"micro_batches={micro_batches}: Embedding {', '.join(scaled)} has "
                           "scale_grad_by_freq=True, which counts each id over the whole batch, "
                           "not a micro-batch; use micro_batches=1 (or a memory_budget that "
                           "fits without micro-batching) or scale_grad_by_freq=False")
    if micro_batches > 1:  # (k = 1 must not slice: the labels need not share the batch)
        micro = labels.shape[0] // micro_batches
        train_inputs = tuple(x[:micro] for x in example_inputs)
        labels = labels[:micro]
    labels_dtype = str(labels.dtype).replace("torch.", "")
    holder = {}

    def extend(bb, graph):
        out_shape = tuple(int(d) for d in graph.output.ty.shape)
        c_dtype = label_spec(loss, out_shape, tuple(labels.shape), labels_dtype)
        y = labels_var(tuple(labels.shape), c_dtype)
        loss_value = append_loss(bb, loss, graph.output, y)
        holder["updates"] = list(graph.buffer_updates)
        holder["labels_dtype"] = c_dtype
        return [y], [loss_value] + list(graph.buffer_updates.values())

    if is_onnx_model(model):
        def importer(inputs, training, extend=None):
            return import_onnx(model, inputs, training, extend, converters)
    else:
        def importer(inputs, training, extend=None):
            return import_forward(model, inputs, training, extend, converters)
    train_mod, graph = importer(train_inputs, True, extend)
    predict_mod, predict_graph = importer(train_inputs, False)

    names = resolve_trainable(graph, trainable, state_reaching_loss(train_mod["main"], graph))
    if isinstance(trainable, SparseUpdate):
        splits = plan_splits(graph, trainable.channel_fractions(names))
        train_mod, graph = split_channels(train_mod, graph, splits)
        names = _model_order(graph, names, splits)
    require = [graph.state_vars[n] for n in names]
    mod = tvm.IRModule({"main": train_mod["main"], "predict": predict_mod["main"]})
    if require:
        try:
            mod = relax.transform.Gradient("main", require_grads=require, target_index=0)(mod)
        except Exception as err:  # a Relax op with no gradient rule
            raise CompileError(f"taking the gradient failed: {str(err).splitlines()[-1]}") from None
        mod = drop_unread_weight_gradients(_adjoint_as_main(mod))
    return TrainingModule(mod=mod, graph=graph, predict_graph=predict_graph,
                          labels_shape=labels_shape, labels_dtype=holder["labels_dtype"],
                          trainable=names, buffer_updates=holder["updates"],
                          channel_splits=splits, micro_batches=micro_batches)
