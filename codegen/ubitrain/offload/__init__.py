"""An int8 step split between a CPU and a DSP (hexagon-v66, NITI(dsp_offload=True)).

    placement.py  each call of the step on the DSP or the CPU (an MILP over a cost model)
    split.py      the step cut at the DSP's runs: the DSP part's project, the CPU part
    overlap.py    which CPU kernels run while the DSP works on a segment
    trainer.py    the two parts trained from Python, joined by pipes, under emulators
"""
