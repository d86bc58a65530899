"""Fidelity: does the generated C train a model as PyTorch does?

- referee.py: the verdict for one model, step by step against PyTorch in float64, with a
  tolerance derived from PyTorch's own float32 spread (reference.py runs PyTorch; kinks.py
  finds the data where two correct float32 programs may back-propagate differently;
  dropout.py draws the C runtime's Dropout masks).
- fuzz.py: the differential fuzzer over random models (graphs.py, the op table ops/).
"""
