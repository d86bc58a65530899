"""The evaluation-mode forward walked into the predict program: the model's output copied
to the caller's buffer, looped over the rows of the batch with micro-batches (nothing
couples the samples in evaluation mode)."""

from __future__ import annotations

from ..errors import CompileError
from .ir import Call, Program, Slot
from .micro_batch import loop_calls, micro_slices, whole_batch
from .walk import FunctionWalker


def predict_program(mod, tm, library, inputs: list[Slot], state: dict):
    """(the predict program, its output slot)."""
    pred_fn, pg, g, k = mod["predict"], tm.predict_graph, tm.graph, tm.micro_batches
    if pg.random_masks:
        raise CompileError(
            f"the model draws {len(pg.random_masks)} random mask(s) in evaluation mode too "
            "(F.dropout(..., training=True) or a bernoulli_ whatever self.training is); "
            "predict has no random draws: pass training=self.training")
    pred_inputs = inputs if k == 1 else micro_slices(inputs, [s.shape for s in g.input_specs])
    env = dict(zip(pred_fn.params, pred_inputs + [state[s.name] for s in pg.state]))
    walker = FunctionWalker(mod, library, env, "pr_")
    out = walker.walk(pred_fn)
    if k > 1 and (not out.shape or out.shape[0] != g.input_specs[0].shape[0]):
        raise CompileError(f"micro_batches={k} needs the model output's first dimension to be "
                           f"the batch, got output shape {list(out.shape)} for a micro-batch "
                           f"of {g.input_specs[0].shape[0]}; use micro_batches=1")
    output = Slot("output", whole_batch(out.shape, k), out.dtype, "output")
    pred_out = output if k == 1 else micro_slices([output], [out.shape])[0]
    predict = Program("predict", walker.calls + [Call("ub_copy", [out, pred_out], [1],
                                                      builtin=True)])
    if k > 1:  # each micro-batch's rows of the output
        predict.calls = loop_calls(predict.calls, [], None, k, zip(pred_inputs + [pred_out],
                                                                   inputs + [output]), library)[0]
    return predict, output
