"""precision="int8": NITI's integer-only training (docs/algorithms.md).

rounding.py, quantize.py, loss.py, rescale.py, update.py and reference.py are the numpy
reference of the algorithm; lower.py turns a module into the int8 layer program (layers.py).
"""

from .update import NITI

__all__ = ["NITI"]
