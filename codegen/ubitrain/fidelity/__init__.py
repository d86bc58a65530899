"""Fidelity: does the generated C train a model as PyTorch does?

- referee.py: the verdict for one model, step by step against PyTorch in float64, with a
  tolerance derived from PyTorch's own float32 spread (reference.py runs PyTorch; kinks.py
  finds the data where two correct float32 programs may back-propagate differently;
  dropout.py draws the C runtime's Dropout masks).
The differential fuzzer that judges random models so is the repository's own development
tool (tools/fuzzing/, `python -m tools.fuzzing`), not part of the package.
"""
