"""Losses appended to the forward graph, with the label checks each one needs."""

from tvm import relax
from tvm.relax import op as R

from ..errors import CompileError
from ..ops.softmax_cross_entropy import softmax_cross_entropy

LOSSES = ("cross_entropy", "mse")


def label_spec(loss: str, output_shape, labels_shape, labels_dtype: str):
    """Check labels against the loss and the model output; return the labels' C-side dtype."""
    if loss == "cross_entropy":
        if len(output_shape) != 2:
            raise CompileError(f"loss='cross_entropy' needs model output [batch, classes], "
                               f"got shape {list(output_shape)}")
        if not labels_dtype.startswith(("int", "uint")):
            raise CompileError(f"loss='cross_entropy' needs integer class labels, got dtype "
                             f"{labels_dtype}; pass class indices (e.g. torch.long)")
        if tuple(labels_shape) != (output_shape[0],):
            raise CompileError(f"loss='cross_entropy' needs labels of shape [{output_shape[0]}] "
                             f"(one class index per sample), got {list(labels_shape)}")
        return "int32"
    if loss == "mse":
        if tuple(labels_shape) != tuple(output_shape):
            raise CompileError(f"loss='mse' needs labels shaped like the model output "
                             f"{list(output_shape)}, got {list(labels_shape)}")
        if not labels_dtype.startswith("float"):
            raise CompileError(f"loss='mse' needs float labels, got dtype {labels_dtype}")
        return "float32"
    raise CompileError(f"unknown loss {loss!r}; supported: {', '.join(LOSSES)}")


def append_loss(bb, loss: str, output, labels):
    if loss == "cross_entropy":
        return bb.emit(softmax_cross_entropy(output, labels))  # one kernel each way
    diff = bb.emit(R.subtract(output, labels))
    return bb.emit(R.mean(R.multiply(diff, diff)))


def labels_var(shape, dtype):
    return relax.Var("labels", relax.TensorType(tuple(shape), dtype))
