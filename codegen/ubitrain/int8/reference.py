"""The whole NITI integer training step in numpy: the reference the generated C must equal
bit for bit (weights, the state vector with every exponent, shift and counter).

Forward: the float input is quantized (quantize.py); each Conv accumulates int8 x int8 in
int32, picks its shift at its forward site (rescale.py; bit length of the maximum - 7) and
rounds with RoundShift; ReLU, max-pool and flatten work on int8. Loss: the integer softmax
cross-entropy gradient (loss.py). Backward, per Conv from the last: the weight gradient and
the input error accumulate in int32 from the int8 error (the error through the weights before
they change); the error is rescaled like an activation, the gradient renormalised with
PstoShift to 2^mu and subtracted (update.py). ReLU passes the error where its output is
positive; max-pool sends it to the first maximum of each window (row-major). A frozen Conv
(trainable=) passes the error on without a gradient or update, and the backward pass stops
at the first trained Conv.
"""

from __future__ import annotations

import numpy as np

from ..niti.int_conv import conv2d, conv2d_input_grad, conv2d_weight_grad
from ..niti.loss import cross_entropy, softmax_xent_grad
from ..niti.pooling import max_pool, max_pool_backward
from ..niti.quantize import dequantize, quantize
from ..niti.rescale import ADAPTIVE, EXACT, EXACT_COUNTED, EXPONENT, SITE_FIELDS, site_shift
from ..niti.rounding import as_i64, clip8, psto_shift, round_shift
from ..niti.tables import table_index
from .layers import (
    INPUT_EXPONENT_INDEX,
    STEP_INDEX,
    Conv,
    Elementwise,
    Flatten,
    LayerProgram,
    MaxPool,
    ReLU,
    site_offset,
)
from .update import NITI


class NitiReference:
    def __init__(self, program: LayerProgram, config: NITI | None = None):
        self.program = program
        self.config = config or NITI()
        self.weights = {k: as_i64(v) for k, (v, _) in program.weights.items()}
        self.exponents = {k: int(e) for k, (_, e) in program.weights.items()}
        self.state = np.zeros(program.state_size, np.int64)

    def site(self, index: int) -> np.ndarray:
        start = site_offset(index)
        return self.state[start:start + SITE_FIELDS]  # a view: updates land in self.state

    def _shift(self, acc, index: int, bits: int, mode: int) -> int:
        return site_shift(acc, self.site(index), bits, mode, self.config.max_interval)

    def forward(self, x, mode: int):
        h, e = quantize(x)
        h = as_i64(h)
        self.state[INPUT_EXPONENT_INDEX] = e
        saved, self._in_exp = [], []
        for layer in self.program.layers:
            saved.append(h)
            self._in_exp.append(e)
            if isinstance(layer, Conv):
                w = self.weights[layer.weight].reshape(layer.out_shape[1], layer.in_shape[1],
                                                      *layer.kernel)
                acc = conv2d(h.reshape(layer.in_shape), w, layer.stride, layer.padding)
                s = self._shift(acc, layer.fwd_site, 7, mode)
                h = clip8(round_shift(acc, s))
                e = e + self.exponents[layer.weight] + s
                self.site(layer.fwd_site)[EXPONENT] = e
                if layer.linear:
                    h = h.reshape(layer.out_shape[:2])
            elif isinstance(layer, ReLU):
                h = np.maximum(h, 0)
            elif isinstance(layer, Elementwise):
                col, row = table_index(h, e)
                h = as_i64(layer.f[row][col])
                e = int(layer.f_exp[row])
                self.site(layer.fwd_site)[EXPONENT] = e
            elif isinstance(layer, MaxPool):
                h = max_pool(h, layer.kernel)
            elif isinstance(layer, Flatten):
                h = h.reshape(layer.out_shape)
        return h, e, saved

    def predict(self, x) -> np.ndarray:
        logits, e, _ = self.forward(x, EXACT)
        return dequantize(logits, e)

    def step(self, x, labels) -> float:
        mode = ADAPTIVE if self.config.adaptive_rescale else EXACT_COUNTED
        logits, e, saved = self.forward(x, mode)
        loss = cross_entropy(logits, e, labels)
        err = as_i64(softmax_xent_grad(logits, e, labels))
        mu = self.config.mu_at(int(self.state[STEP_INDEX]))
        for i in range(len(self.program.layers) - 1, self.program.first_trained() - 1, -1):
            layer, x_in = self.program.layers[i], saved[i]
            if isinstance(layer, Conv):
                err = self._conv_backward(layer, x_in, err, mu, mode)
            elif isinstance(layer, ReLU):
                err = np.where(saved[i + 1] > 0, err, 0) if i + 1 < len(saved) else \
                    np.where(np.maximum(x_in, 0) > 0, err, 0)
            elif isinstance(layer, Elementwise):
                col, row = table_index(x_in, self._in_exp[i])
                acc = as_i64(err) * as_i64(layer.d[row][col])
                s = self._shift(acc, layer.error_site, 7, mode)
                err = clip8(round_shift(acc, s))
            elif isinstance(layer, MaxPool):
                err = max_pool_backward(x_in, err, layer.kernel)
            elif isinstance(layer, Flatten):
                err = err.reshape(layer.in_shape)
        self.state[STEP_INDEX] += 1
        return loss

    def _conv_backward(self, layer: Conv, x_in, err, mu: int, mode: int):
        shape4 = (layer.out_shape[1], layer.in_shape[1], *layer.kernel)
        w = self.weights[layer.weight].reshape(shape4)
        x4, err4 = x_in.reshape(layer.in_shape), err.reshape(layer.out_shape)
        err_in = None
        if layer.error_site >= 0:
            acc = conv2d_input_grad(err4, w, layer.in_shape, layer.stride, layer.padding)
            s = self._shift(acc, layer.error_site, 7, mode)
            err_in = clip8(round_shift(acc, s))
            if layer.linear:
                err_in = err_in.reshape(layer.in_shape[:2])
        if layer.trainable:
            grad = conv2d_weight_grad(x4, err4, layer.kernel, layer.stride, layer.padding)
            s = self._shift(grad, layer.grad_site, mu, mode)
            new = clip8(w - clip8(psto_shift(grad, s)))
            self.weights[layer.weight] = new.reshape(layer.weight_shape)
        return err_in

    def parameters(self) -> dict[str, np.ndarray]:
        """Weights as floats (int8 value x 2^exponent), by state_dict name."""
        return {k: dequantize(v, self.exponents[k]) for k, v in self.weights.items()}
