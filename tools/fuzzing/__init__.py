"""The differential fuzzer: random models trained through the generated C and judged against
PyTorch (ubitrain.fidelity), the project's own check of the compiler on models nobody wrote.

- case.py: one case (a seed's model, data, optimizer and passes switched off) and its run;
- graphs.py: random models as graphs over the op table (ops/, one module per kind of op);
- campaign.py: many seeds in worker processes, their records and summary;
- reduce.py: a failing case shrunk to a small repro script;
- __main__.py: `python -m tools.fuzzing --seeds A:B --jobs N --out DIR [--resume]`.
"""
