"""An ONNX model exported for inference, told apart from one exported for training.

`torch.onnx.export` exports in eval mode by default: constant folding merges each BatchNorm
into the convolution before it (the merged weights become initializers named
`onnx::Conv_<n>`, a name the exporter gives the constants it computed), or, without
folding, BatchNormalization keeps `training_mode=0` and normalises with its running
statistics; Dropout is left out. Such a model compiles and trains, but not as the PyTorch
module would, so the compile warns and says how to export for training.
"""

from __future__ import annotations

from ..errors import warn

HOW = ("export for training: torch.onnx.export(model, args, path, dynamo=False, "
       "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)")
WEIGHTED = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,)}


def _label(node) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def inference_signs(graph) -> list[str]:
    """What in `graph` shows an inference export (empty: nothing does)."""
    signs = []
    for node in graph.node:
        if node.op_type == "BatchNormalization":
            mode = next((a.i for a in node.attribute if a.name == "training_mode"), 0)
            if not mode and len(node.output) == 1:
                signs.append(f"BatchNormalization node {_label(node)!r} has training_mode=0 "
                             "(its running statistics normalise and never update)")
    initializers = {t.name for t in graph.initializer}
    for node in graph.node:
        folded = [node.input[i] for i in WEIGHTED.get(node.op_type, ())
                  if i < len(node.input) and node.input[i] in initializers
                  and node.input[i].startswith("onnx::")]
        if folded:
            signs.append(f"{node.op_type} node {_label(node)!r} reads {folded[0]!r}, a "
                         "constant the exporter folded (a weight transposed, or a BatchNorm merged "
                         "into it)")
    return signs


def warn_if_exported_for_inference(model) -> None:
    signs = inference_signs(model.graph)
    if signs:
        more = f" (and {len(signs) - 1} more)" if len(signs) > 1 else ""
        warn(f"the ONNX model was exported for inference: {signs[0]}{more}; it trains, but "
             f"not as the PyTorch module would: {HOW}")
