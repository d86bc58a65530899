"""The project's development tools, kept out of the `ubitrain` wheel: they import ubitrain,
nothing in ubitrain imports them. The tests and benchmarks import them from the repository's
root (tests/conftest.py and benchmarks/_results.py put it on sys.path).

- fuzzing/: the differential fuzzer and its campaigns (`python -m tools.fuzzing`);
- real_models.py: the real-model fidelity suite's model definitions;
- greedy_planner.py: TFLM's greedy planner, the baseline the arena planner is measured against;
- microkernels/: the kernel cases and the emulator harness of the micro-kernel tests and
  benchmarks/icount.py.
"""
