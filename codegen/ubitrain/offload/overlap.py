"""Which CPU kernels of a split step run while the DSP works on a segment.

The offload interface is asynchronous (ub_offload_submit, later ub_offload_wait). The CPU
part submits a segment before the CPU kernels that precede it in the step as long as they do
not conflict with it, and runs the kernels that follow it up to the first one that conflicts;
it waits for the segment before that kernel (and before the next segment: the DSP runs one
at a time). A kernel conflicts when any arena bytes it uses (arguments, scratch) overlap a
buffer of the segment, unless it only reads them and the segment only reads them too: a
transport may map the buffers instead of copying (FastRPC with ION), so the CPU must neither
write what the DSP reads nor read what it writes back. The arena plan is that of the whole
step, so byte ranges, not tensors, decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..program.ir import Call, Program


@dataclass
class Overlap:
    method: int
    before: list[str] = field(default_factory=list)  # run after an early submit
    after: list[str] = field(default_factory=list)  # run before a late wait
    stop: str = ""  # why the wait comes where it does

    @property
    def kernels(self) -> list[str]:
        """The CPU kernels that run while the DSP works on the segment."""
        return self.before + self.after


def _range(slot, plan) -> tuple[int, int]:
    start = plan.offsets[slot.root] + slot.root_offset
    return start, start + slot.nbytes


def conflict(call: Call, seg, plan) -> str:
    """Why `call` cannot run while segment `seg` is on the DSP ("" when it can)."""
    seg_ranges = [(_range(r, plan), id(r) in seg.written, r.name) for r in seg.roots]
    used = [(s, i in call.outputs) for i, s in enumerate(call.args)]
    if call.scratch is not None:
        used.append((call.scratch, True))
    for slot, writes in used:
        if slot.root.external or slot.root.kind == "constant":
            continue  # the caller's input or output, or read-only data: not in the arena
        lo, hi = _range(slot, plan)
        for (s_lo, s_hi), seg_writes, name in seg_ranges:
            if lo < s_hi and s_lo < hi and (writes or seg_writes):
                verb = "writes" if writes else "reads"
                what = "writes back" if seg_writes else "reads"
                return (f"{call.kernel} {verb} {slot.name}, which overlaps {name} that DSP "
                        f"segment {seg.method} {what}")
    return ""


def _segment_method(call: Call) -> int | None:
    prefix = "ub_dsp_segment_"
    return int(call.kernel[len(prefix):]) if call.kernel.startswith(prefix) else None


def _blocks(cpu_program: Program, segments, plan):
    """Per segment: (its index in the program, indices of the CPU calls before it that run
    after its submit, indices after it that run before its wait, why the wait stops)."""
    by_method = {s.method: s for s in segments}
    calls = cpu_program.calls
    result, delayed = [], set()
    for k, call in enumerate(calls):
        method = _segment_method(call)
        if method is None:
            continue
        seg = by_method[method]
        before = []
        for j in range(k - 1, -1, -1):  # submit early: not before the previous segment's wait
            if _segment_method(calls[j]) is not None or j in delayed \
                    or conflict(calls[j], seg, plan):
                break
            before.insert(0, j)
        after, stop = [], "end of the step"
        for j in range(k + 1, len(calls)):  # wait late: the DSP runs one segment at a time
            if _segment_method(calls[j]) is not None:
                stop = "the next DSP segment waits for this one"
                break
            why = conflict(calls[j], seg, plan)
            if why:
                stop = why
                break
            after.append(j)
        delayed.update(after)
        result.append((k, method, before, after, stop))
    return result


def schedule(cpu_program: Program, segments, plan) -> list[Overlap]:
    """Per segment, the CPU kernels between its submit and its wait."""
    calls = cpu_program.calls
    names = lambda indices: [calls[j].kernel for j in indices]  # noqa: E731
    return [Overlap(method, names(before), names(after), stop)
            for _, method, before, after, stop in _blocks(cpu_program, segments, plan)]


def apply(cpu_program: Program, segments, plan) -> Program:
    """The CPU part with each segment call split into a submit, as early as the data allow,
    and a wait, as late as they allow."""
    calls = cpu_program.calls
    submit_at, wait_after = {}, {}
    for k, method, before, after, _ in _blocks(cpu_program, segments, plan):
        submit = Call(f"ub_dsp_submit_{method}", calls[k].args, calls[k].outputs)
        wait = Call(f"ub_dsp_wait_{method}", calls[k].args, calls[k].outputs)
        submit_at[before[0] if before else k] = submit
        wait_after[after[-1] if after else k] = wait
    out = []
    for k, call in enumerate(calls):
        if k in submit_at:
            out.append(submit_at[k])
        if _segment_method(call) is None:
            out.append(call)
        if k in wait_after:
            out.append(wait_after[k])
    return Program(cpu_program.name, out)


def report(overlaps: list[Overlap]) -> str:
    lines = []
    for ov in overlaps:
        during = ", ".join(ov.kernels) if ov.kernels else "no CPU kernel"
        lines.append(f"DSP segment {ov.method}: {during} while the DSP works; then wait "
                     f"({ov.stop})")
    return "\n".join(lines)
