"""F.pad and the padding modules in every mode: the generated C against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how): the gradient of a
border element goes back to the element it copies, so reflect, replicate and circular
borders each add into the input's gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_harness import Fn, check, randn
from torch import nn

import ubitrain as ub

CASES = {
    "zero_pad_2d": (nn.ZeroPad2d((1, 2, 0, 3)), (2, 3, 4, 5)),
    "constant_value": (nn.ConstantPad2d(2, -1.5), (2, 3, 4, 5)),
    "constant_crop": (Fn(lambda x: F.pad(x, (-1, 2, 1, -2))), (2, 3, 4, 5)),
    "constant_3_dims": (Fn(lambda x: F.pad(x, (1, 0, 0, 2, 1, 1), value=0.5)), (2, 3, 4, 5)),
    "constant_1d": (nn.ConstantPad1d((0, 3), 2.0), (2, 3, 6)),
    "reflect_2d": (nn.ReflectionPad2d((1, 3, 2, 0)), (2, 3, 4, 5)),
    "reflect_widest": (Fn(lambda x: F.pad(x, (4, 4, 3, 3), mode="reflect")), (1, 2, 4, 5)),
    "reflect_1d": (nn.ReflectionPad1d(2), (2, 3, 6)),
    "replicate_2d": (nn.ReplicationPad2d((2, 0, 1, 3)), (2, 3, 4, 5)),
    "replicate_1d": (nn.ReplicationPad1d((3, 1)), (2, 3, 6)),
    "circular_2d": (Fn(lambda x: F.pad(x, (2, 1, 4, 0), mode="circular")), (2, 3, 4, 5)),
    "circular_1d": (nn.CircularPad1d((6, 2)), (2, 3, 6)),
    "pad_then_conv": (nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, 4, 3)), (2, 3, 5, 5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pad(name, tmp_path):
    module, shape = CASES[name]
    check(module, (randn(*shape, seed=5),), tmp_path)


@pytest.mark.parametrize("fn,shape,message", [
    (lambda x: F.pad(x, (-3, -2)) + 1.0, (2, 3, 4, 5), r"pad \(-3, -2\) that crops all 5"),
    (lambda x: F.pad(x, (-1, 1), mode="circular"), (2, 3, 6),
     "pad mode 'circular' with a negative pad"),
], ids=["crops_everything", "negative_circular"])
def test_refused_with_the_pad_named(fn, shape, message, tmp_path):
    x = randn(*shape)
    with pytest.raises(ub.UnsupportedOpError, match=message):
        ub.compile(Fn(fn), (x,), torch.zeros_like(x), loss="mse", out_dir=tmp_path)
