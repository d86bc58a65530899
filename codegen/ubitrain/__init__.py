"""ubitrain: an on-device training compiler.

    pkg = ubitrain.compile(model, (x,), y, loss="cross_entropy", optimizer=ubitrain.SGD(0.05))
    trainer = pkg.build()
    loss = trainer.step(x, y)
"""

from .api import Package, compile
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
from .project.manifest import load_package
from .training.sparse_update import SparseUpdate

__all__ = ["compile", "Package", "load_package", "SGD", "Adam", "AdamW", "NITI", "SparseUpdate",
           "CompileError",
           "UnsupportedOpError",
           "InputError", "BuildError", "RuntimeStatusError", "UbitrainError",
           "UbitrainWarning"]
__version__ = "0.1.0"
