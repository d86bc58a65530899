"""TE kernels of the fused softmax + cross-entropy (training/softmax_cross_entropy.py).

Numerically stable: each row's maximum is subtracted before exp, and the sums accumulate
in `acc`. Labels were range-checked by the step function before any kernel runs.
"""

from __future__ import annotations

from tvm import te, tirx


def _row_stats(logits, acc: str):
    """Per row: the maximum, and the sum of exp(z - max) accumulated in `acc`."""
    batch, classes = (int(d) for d in logits.shape)
    k = te.reduce_axis((0, classes), name="k_max")
    row_max = te.compute((batch,), lambda b: te.max(logits[b, k], axis=k), name="ce_row_max")
    j = te.reduce_axis((0, classes), name="k_sum")
    row_sum = te.compute((batch,), lambda b: te.sum(
        tirx.exp(logits[b, j] - row_max[b]).astype(acc), axis=j), name="ce_row_sum")
    return row_max, row_sum


def softmax_cross_entropy(logits, labels, acc: str):
    """The mean over the batch of -log softmax(z)[label], a 0-d tensor."""
    batch = int(logits.shape[0])
    row_max, row_sum = _row_stats(logits, acc)
    b = te.reduce_axis((0, batch), name="b")
    total = te.compute((), lambda: te.sum(
        tirx.log(row_sum[b]) + row_max[b].astype(acc) - logits[b, labels[b]].astype(acc),
        axis=b), name="ce_total")
    return te.compute((), lambda: (total() / tirx.const(batch, acc)).astype(logits.dtype),
                      name="ce_loss")


def softmax_cross_entropy_backward(logits, labels, loss_grad, acc: str):
    """d loss / d logits = (softmax(z) - onehot(label)) * loss_grad / batch."""
    batch = int(logits.shape[0])
    dtype = logits.dtype
    row_max, row_sum = _row_stats(logits, acc)
    inv_sum = te.compute(row_sum.shape, lambda b: (tirx.const(1, acc) / row_sum[b]).astype(dtype),
                         name="ce_inv_sum")
    scale = te.compute((), lambda: loss_grad() / tirx.const(batch, dtype), name="ce_scale")

    def grad(b, k):
        prob = tirx.exp(logits[b, k] - row_max[b]) * inv_sum[b]
        onehot = tirx.Select(labels[b] == k.astype(labels.dtype), tirx.const(1, dtype),
                             tirx.const(0, dtype))
        return (prob - onehot) * scale()

    return te.compute(logits.shape, grad, name="ce_grad")
