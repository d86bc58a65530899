"""The demos `ubitrain demo` runs: the digits CNN trained through the generated C beside
PyTorch (digits.py), in int8 beside fp32 (int8.py), and a sparse-update transfer (sparse.py);
data.py loads and batches scikit-learn's digits for all three."""
