"""What the micro-kernel tests and the instruction-count benchmarks build kernels with:
cases.py makes the kernels a training graph makes (Relax op, its gradient, legalized with
ubitrain's tagging rules); harness.py runs kernel variants side by side in one program under
a target's emulator. The micro-kernels themselves are ubitrain's
(ubitrain/kernels/microkernels/)."""
