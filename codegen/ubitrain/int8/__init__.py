"""precision="int8": NITI's integer-only training (docs/algorithms.md): its options
(update.py, ub.NITI) and the compile's result (package.py). The algorithm's spec is niti/,
its numpy reference fidelity/niti_reference.py, the compile pipeline/int8.py.
"""

from .update import NITI

__all__ = ["NITI"]
