"""The training function walked into train_step's calls, with what Relax does not express:
Dropout masks drawn first, a check that the loss is finite before anything is written (the
calls after the loss are the backward pass: their activations become gradients), and the
new BatchNorm buffers copied back to the state."""

from __future__ import annotations

from .ir import Call, Slot
from .micro_batch import micro_slices, shadow_of, whole_batch
from .walk import FunctionWalker


def step_io(tm) -> tuple[list[Slot], Slot, list[Slot]]:
    """(the inputs the C API takes, the labels, what one micro-batch of the step reads:
    the same slots, or slices of them with micro-batches)."""
    g, k = tm.graph, tm.micro_batches
    inputs = [Slot(spec.name, whole_batch(spec.shape, k), spec.dtype, "input",
                   index_bound=spec.index_bound)
              for spec in g.input_specs]  # the whole batch: the C API
    labels = Slot("labels", tm.labels_shape, tm.labels_dtype, "label")
    io = inputs + [labels]
    if k > 1:
        io = micro_slices(io, [s.shape for s in g.input_specs]
                          + [(tm.labels_shape[0] // k,) + tm.labels_shape[1:]])
    return inputs, labels, io


def train_calls(mod, tm, library, state: dict, parts: dict, io: list[Slot]):
    """(calls, the gradient of each trained parameter, the loss slot, BatchNorm shadows)."""
    g = tm.graph
    train_fn = mod["main"]
    # With micro-batches, BatchNorm's running statistics go through shadows copied back
    # after the loop, so that a non-finite loss in any micro-batch leaves the state as it was.
    shadows = ({n: shadow_of(state[n]) for n in tm.buffer_updates}
               if tm.micro_batches > 1 else {})
    train_state = [shadows.get(s.name) or parts.get(s.name) or state[s.name] for s in g.state]
    env = dict(zip(train_fn.params, io + train_state))
    walker = FunctionWalker(mod, library, env, "tr_")
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
    calls.insert(loss_at + 1, Call("ub_check_loss", [loss], [], builtin=True))
    for name, new in zip(tm.buffer_updates, new_buffers):
        calls.append(Call("ub_copy", [new, shadows.get(name, state[name])], [1], builtin=True))
    return calls, grads, loss, shadows


def _last_write(calls, slot) -> int:
    return max(i for i, c in enumerate(calls) if any(w.root is slot.root for w in c.writes))
