"""The chain-only pipeline's DSP support table and costs (pipeline/int8_chain.py), for the
placement solver of offload/placement.py: int8 convolutions and linear layers (forward,
input error, weight gradient with the update), ReLU and its mask, and max-pooling run on
HVX; the float input quantization, the loss, the float output, the pooling-gradient
scatter, the float-fallback tables and the step bookkeeping stay on the CPU."""

from __future__ import annotations

import re

from ..offload.placement import Placed, cycles, place

DSP_OPS = ("conv2d", "conv2d_input_grad", "conv2d_filter_grad_update", "linear",
           "linear_input_grad", "linear_filter_grad_update", "relu", "relu_backward",
           "max_pool")


def kernel_op(call) -> str:
    m = re.match(r"ub_s8_(.+)_l\d+_ukernel__\w+$", call.kernel)
    return m.group(1) if m else call.kernel


def place_chain(program) -> list[Placed]:
    """The chain's kernels tag their multiply-accumulates (int8/program.py)."""
    return place(program, lambda call: cycles(float(call.attrs.get("macs", 0)), call),
                 lambda call: kernel_op(call) in DSP_OPS, kernel_op)
