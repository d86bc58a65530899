"""ubitrain: an on-device training compiler.

    pkg = ubitrain.compile(model, (x,), y, loss="cross_entropy", optimizer=ubitrain.SGD(0.05))
    trainer = pkg.build()
    loss = trainer.step(x, y)
"""

from .api import compile, load_package
from .errors import (
    BuildError,
    CompileError,
    InputError,
    RuntimeStatusError,
    UbitrainError,
    UbitrainWarning,
    UnsupportedOpError,
)
from .int8.update import NITI
from .optim import SGD, Adam, AdamW
from .package import Package
from .training.sparse_update import SparseUpdate

__all__ = ["compile", "load_package", "Package", "SGD", "Adam", "AdamW", "NITI", "SparseUpdate",
           "CompileError", "UnsupportedOpError", "InputError", "BuildError",
           "RuntimeStatusError", "UbitrainError", "UbitrainWarning"]
__version__ = "0.1.0"
