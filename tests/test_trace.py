"""fidelity/trace.py finds the kernel call that computes something else than its TIR."""

import torch
import torch.nn.functional as F
from torch import nn

import ubitrain as ub
import ubitrain.kernels.c_printer as c_printer
from ubitrain.fidelity.trace import check_calls


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 8, 3, 1, 1), nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.avg_pool2d(F.relu(self.c(x)), 2).flatten(1))


def _check():
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    return check_calls(Net(), (x,), y, optimizer=ub.SGD(lr=0.1))


def test_every_call_agrees_with_its_prim_func():
    assert _check() == []


def test_a_planted_printer_bug_is_found(monkeypatch):
    """The printer hoisting every value of a run of stores above the first store (the bug
    that zeroed an in-place reduction's accumulator after its update)."""
    def hoist_always(self, children):
        stores = [c for c in children if type(c) is c_printer.tirx.BufferStore]
        if len(stores) == len(children) and stores:
            self.stores_after_loads(stores)
        else:
            for child in children:
                self.stmt(child)

    monkeypatch.setattr(c_printer._Printer, "in_place_sequence", hoist_always)
    found = _check()
    assert [m.kernel for m in found] == [
        "ub_f32_fused_avg_pool2d_backward_greater_where_inplace__scalar"], found
