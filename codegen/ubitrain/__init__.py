"""ubitrain: an on-device training compiler.

    pkg = ubitrain.compile(model, (x,), y, loss="cross_entropy", optimizer=ubitrain.SGD(0.05))
    trainer = pkg.build()
    loss = trainer.step(x, y)
"""

import importlib

# Each public name from the module that defines it, imported on first use (PEP 562): the API
# pulls in torch and TVM, and `ubitrain --help` should not wait seconds for them.
_PUBLIC = {
    "compile": ".api", "load_package": ".api", "Package": ".package", "SGD": ".optim",
    "Adam": ".optim", "AdamW": ".optim", "NITI": ".int8.update",
    "SparseUpdate": ".training.sparse_update", "CompileError": ".errors",
    "UnsupportedOpError": ".errors", "InputError": ".errors", "BuildError": ".errors",
    "RuntimeStatusError": ".errors", "UbitrainError": ".errors", "UbitrainWarning": ".errors",
}

__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'ubitrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
