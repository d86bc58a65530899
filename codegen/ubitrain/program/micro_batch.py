"""Micro-batching with gradient accumulation: the step runs its batch as k micro-batches.

The training graph is traced at batch B/k (training/graph.py). Its calls become the body of
a loop that the C step runs k times, each time on the next B/k samples of the caller's full
batch (the C API is unchanged: one batch in, one step; `predict` loops the same way over
the rows of its input and output, which nothing couples in evaluation mode):

    zero the gradient accumulators and the loss accumulator
    for mb in 0..k-1:                        ub_micro_batch_begin / ub_micro_batch_end
        forward, loss check, backward on samples [mb·B/k, (mb+1)·B/k)
        acc_p += grad_p / k   after the last use of grad_p (so grad_p dies there)
        loss_acc += loss / k
    copy BatchNorm's running statistics back from their shadows (see below)
    optimizer update of every p from acc_p   (placed after the loop by program/build.py)

With a mean loss every micro-batch's loss and gradients are means over B/k samples, so the
average of the k of them is the full-batch mean (the scale 1/k is exact when k is a power of
two); int8's integer gradients add up at one exponent instead (program/niti_micro_batch.py).
The early in-place update of the plain step is impossible here: a parameter is read
by every micro-batch. The accumulators ("accumulator" slots, one per trained parameter)
are the price; they live from the zeroing to the update (and to the loop's end at least:
Program.lifetimes), so the arena planner keeps them through the whole loop, and
program/remat.py never pages or recomputes them. Everything
else in the body lives within one iteration, so the lifetimes of the flat call list are the
lifetimes of every iteration. BatchNorm's running statistics are updated by every
micro-batch, in a shadow copy ("accumulator" too) that goes back to the state after the
loop: like the plain step, a step whose loss is not finite in any micro-batch changes no
state.
"""

from __future__ import annotations

import numpy as np
from tvm import te

from .ir import LOOP_END, Call, Program, Slot, users

BEGIN, END, ZERO = "ub_micro_batch_begin", LOOP_END, "ub_zero"


def micro_slices(full: list[Slot], micro_shapes: list[tuple]) -> list[Slot]:
    """The slots a micro-batch reads in place of the caller's inputs: same names, B/k rows;
    the C step points them at the current micro-batch's rows of the full arrays."""
    return [Slot(f"{s.name}_mb", tuple(shape), s.dtype, s.kind) for s, shape in
            zip(full, micro_shapes)]


def whole_batch(shape: tuple, count: int) -> tuple:
    """A micro-batch tensor's shape at the whole batch (the batch is dimension 0)."""
    return (shape[0] * count,) + tuple(shape[1:]) if count > 1 else tuple(shape)


def shadow_of(buffer: Slot) -> Slot:
    """Where the loop keeps a state buffer (BatchNorm's running statistics) that every
    micro-batch updates, until the loop has checked every micro-batch's loss."""
    return Slot(f"{buffer.name}_shadow", buffer.shape, buffer.dtype, "accumulator")


def loop_calls(body: list[Call], grads: list, loss: Slot | None, count: int, slices,
               library, shadows=(), sums=None):
    """(the calls of the whole step before the optimizer update, the accumulated gradients,
    the accumulated loss). `slices`: (micro-batch slot, full slot) pairs; `shadows`:
    (shadow, state buffer) pairs, copied in before the loop and back after it. Without a
    loss (predict) the body only runs over the slices. `sums(grads, library, scale)`: how
    the gradients add up, (accumulators, calls before the loop, one add per gradient); by
    default their mean (`mean_of_gradients`; int8 sums at one exponent instead)."""
    scale = Slot("micro_batch_scale", (), "float32", "constant",
                 np.array(1.0 / count, dtype="float32"))
    accs, inits, adds = (sums or mean_of_gradients)(grads, library, scale)
    body = _after_last_use(list(body), adds)
    loss_acc = None if loss is None else Slot("loss_acc", loss.shape, loss.dtype, "accumulator")
    if loss is not None:
        body.append(_accumulate(loss_acc, loss, scale, library))
    zeros = inits + ([Call(ZERO, [loss_acc], [0], builtin=True)] if loss_acc else [])
    begin = Call(BEGIN, [], [], builtin=True, attrs={"count": count, "slices": list(slices)})
    end = Call(END, [], [], builtin=True)
    shadow_in = [Call("ub_copy", [state, shadow], [1], builtin=True) for shadow, state in shadows]
    shadow_out = [Call("ub_copy", [shadow, state], [1], builtin=True) for shadow, state in shadows]
    return zeros + shadow_in + [begin] + body + [end] + shadow_out, accs, loss_acc


def mean_of_gradients(grads: list[Slot], library, scale: Slot):
    """acc_p += grad_p * scale (1/k) into an accumulator zeroed before the loop."""
    accs = [Slot(f"{g.root.name}_acc", g.shape, g.dtype, "accumulator") for g in grads]
    return (accs, [Call(ZERO, [a], [0], builtin=True) for a in accs],
            [_accumulate(acc, g, scale, library) for acc, g in zip(accs, grads)])


def _accumulate(acc: Slot, value: Slot, scale: Slot, library) -> Call:
    """acc += value * scale, elementwise and in place."""
    a = te.placeholder(acc.shape, acc.dtype, "acc")
    v = te.placeholder(value.shape, value.dtype, "value")
    s = te.placeholder((), scale.dtype, "scale")
    out = te.compute(acc.shape, lambda *i: a(*i) + v(*i) * s(), name="acc_out")
    kernel = library.add(te.create_prim_func([a, v, s, out]), "accumulate", {0: 3})
    return Call(kernel.name, [acc, value, scale, acc], sorted(kernel.written))


def _after_last_use(calls: list[Call], adds: list[Call]) -> list[Call]:
    """Each add right after the last call of the body that passes what it reads."""
    for add in adds:
        last = max(i for slot in add.reads for i in users(calls, slot))
        calls.insert(last + 1, add)
    return calls


def call_repeats(program: Program) -> list[int]:
    """How many times each call runs in one step (the loop body: k times)."""
    repeats, count = [], 1
    for call in program.calls:
        if call.kernel == BEGIN:
            count = call.attrs["count"]
        repeats.append(count)
        if call.kernel == END:
            count = 1
    return repeats


def has_loop(calls: list[Call]) -> bool:
    """The calls hold a micro-batch loop."""
    return any(c.kernel == BEGIN for c in calls)


def micro_batches_of(program: Program) -> int:
    """k of a step program (1 without micro-batching)."""
    return next((c.attrs["count"] for c in program.calls if c.kernel == BEGIN), 1)
