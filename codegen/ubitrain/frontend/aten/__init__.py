"""The supported ATen ops: `ATEN_CONVERTERS`, `{aten overload: converter}` into Relax.

Each converter receives the conversion context, the FX node and the node's arguments with
tensors already converted to Relax expressions, and returns a Relax expression (or a tuple
of them for multi-output ops). Training-mode semantics follow PyTorch: BatchNorm uses batch
statistics and returns updated running statistics; Dropout multiplies by a mask that the C
runtime draws each step from its seeded RNG. One module per kind of op; importing this
package registers them all.

To add an op: write a converter with `@converts(...)` in the module of its kind, give it a
gradient in `training/gradients.py` if Relax has none, and add a case to
`tests/test_ops_<kind>.py`.
"""

from . import (  # noqa: F401
    activations,
    arithmetic,
    attention,
    convolution,
    creation,
    dropout,
    embedding,
    indexing,
    layout,
    linalg,
    masks,
    math_functions,
    normalization,
    padding,
    pooling,
    slicing,
)
from .registry import ATEN_CONVERTERS, ConvertContext, shape_of, supported_op_names

__all__ = ["ATEN_CONVERTERS", "ConvertContext", "shape_of", "supported_op_names"]
