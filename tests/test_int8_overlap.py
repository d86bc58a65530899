"""Which CPU kernels of a split int8 step run between a DSP segment's submit and its wait
(offload/overlap.py): dependencies by tensor and by arena bytes, on a hand-made step."""

from types import SimpleNamespace

from ubitrain.offload import overlap
from ubitrain.offload.split import Segment
from ubitrain.program.ir import Call, Program, Slot


def slots(*names):
    return [Slot(n, (16,), "int32", "activation") for n in names]


def step(offsets):
    a, b, c, d = slots("a", "b", "c", "d")
    seg = Segment(0, roots=[a, b], written={id(b)})  # reads a, writes b back
    program = Program("train_step", [
        Call("ub_dsp_segment_0", [a, b], [0, 1]),
        Call("k_independent", [c, d], [1]),
        Call("k_reads_b", [b, c], [1]),
        Call("k_last", [d], [0]),
    ])
    plan = SimpleNamespace(offsets=dict(zip((a, b, c, d), offsets)))
    return program, seg, plan


def test_independent_kernel_runs_while_the_dsp_works():
    program, seg, plan = step([0, 64, 128, 192])
    (ov,) = overlap.schedule(program, [seg], plan)
    assert ov.kernels == ["k_independent"]
    assert ov.stop.startswith("k_reads_b reads b") and "writes back" in ov.stop
    order = [c.kernel for c in overlap.apply(program, [seg], plan).calls]
    assert order == ["ub_dsp_submit_0", "k_independent", "ub_dsp_wait_0", "k_reads_b", "k_last"]


def test_shared_arena_bytes_are_a_dependency():
    # d reuses a's bytes (a plan may do so once a is dead): writing it while the DSP may
    # still read a (a mapped buffer) must wait
    program, seg, plan = step([0, 64, 128, 0])
    (ov,) = overlap.schedule(program, [seg], plan)
    assert ov.kernels == [] and "k_independent writes d, which overlaps a" in ov.stop
    order = [c.kernel for c in overlap.apply(program, [seg], plan).calls]
    assert order[:3] == ["ub_dsp_submit_0", "ub_dsp_wait_0", "k_independent"]


def test_reading_what_the_dsp_only_reads_overlaps():
    a, b, c = slots("a", "b", "c")
    seg = Segment(0, roots=[a, b], written={id(b)})
    program = Program("train_step", [Call("ub_dsp_segment_0", [a, b], [0, 1]),
                                     Call("k_reads_a", [a, c], [1])])
    plan = SimpleNamespace(offsets={a: 0, b: 64, c: 128})
    (ov,) = overlap.schedule(program, [seg], plan)
    assert ov.kernels == ["k_reads_a"] and ov.stop == "end of the step"
    order = [c.kernel for c in overlap.apply(program, [seg], plan).calls]
    assert order == ["ub_dsp_submit_0", "k_reads_a", "ub_dsp_wait_0"]


def test_segment_is_submitted_before_independent_cpu_kernels():
    a, b, c, d = slots("a", "b", "c", "d")
    seg = Segment(0, roots=[a, b], written={id(b)})
    program = Program("train_step", [Call("k_writes_a", [c, a], [1]),
                                     Call("k_independent", [c, d], [1]),
                                     Call("ub_dsp_segment_0", [a, b], [0, 1]),
                                     Call("k_reads_b", [b], [])])
    plan = SimpleNamespace(offsets={a: 0, b: 64, c: 128, d: 192})
    (ov,) = overlap.schedule(program, [seg], plan)
    assert ov.before == ["k_independent"] and ov.after == []
    order = [c.kernel for c in overlap.apply(program, [seg], plan).calls]
    assert order == ["k_writes_a", "ub_dsp_submit_0", "k_independent", "ub_dsp_wait_0",
                     "k_reads_b"]
