"""Which CPU kernels of a split step run while the DSP works on a segment.

The offload interface is asynchronous (ub_offload_submit, later ub_offload_wait). The CPU
part submits a segment and runs the kernels that follow it in the step while the DSP works,
up to the first kernel that conflicts with the segment; it waits for the segment before that
kernel (and always before the next segment: the DSP runs one at a time). A kernel conflicts
when any arena bytes it uses (arguments, scratch) overlap a buffer of the segment, unless it
only reads them and the segment only reads them too: a transport may map the buffers instead
of copying (FastRPC with ION), so the CPU must neither write what the DSP reads nor read what
it writes back. The arena plan is that of the whole step, so byte ranges, not tensors, decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..program.ir import Call, Program


@dataclass
class Overlap:
    method: int
    kernels: list[str] = field(default_factory=list)  # run between submit and wait
    stop: str = ""  # why the next kernel waits for the segment


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
        if slot.root.external:
            continue  # the caller's input or output, not in the arena
        lo, hi = _range(slot, plan)
        for (s_lo, s_hi), seg_writes, name in seg_ranges:
            if lo < s_hi and s_lo < hi and (writes or seg_writes):
                verb = "writes" if writes else "reads"
                what = "writes back" if seg_writes else "reads"
                return (f"{call.kernel} {verb} {slot.name}, which overlaps {name} that DSP "
                        f"segment {seg.method} {what}")
    return ""


def schedule(cpu_program: Program, segments, plan) -> list[Overlap]:
    """Per segment, the CPU kernels after its submit and before its wait."""
    by_kernel = {f"ub_dsp_segment_{s.method}": s for s in segments}
    calls = cpu_program.calls
    result = []
    for k, call in enumerate(calls):
        seg = by_kernel.get(call.kernel)
        if seg is None:
            continue
        ov = Overlap(seg.method)
        for nxt in calls[k + 1:]:
            if nxt.kernel in by_kernel:
                ov.stop = "the next DSP segment waits for this one"
                break
            why = conflict(nxt, seg, plan)
            if why:
                ov.stop = why
                break
            ov.kernels.append(nxt.kernel)
        else:
            ov.stop = "end of the step"
        result.append(ov)
    return result


def apply(cpu_program: Program, overlaps: list[Overlap]) -> Program:
    """The CPU part with each segment call split into submit and wait, the wait placed after
    the kernels that overlap it."""
    by_method = {ov.method: ov for ov in overlaps}
    calls, pending = [], []  # pending: (kernels left to pass, the wait call)
    for call in cpu_program.calls:
        if call.kernel.startswith("ub_dsp_segment_"):
            method = int(call.kernel.rsplit("_", 1)[1])
            calls.append(Call(f"ub_dsp_submit_{method}", call.args, call.outputs))
            wait = Call(f"ub_dsp_wait_{method}", call.args, call.outputs)
            left = len(by_method[method].kernels)
            if left == 0:
                calls.append(wait)
            else:
                pending.append([left, wait])
            continue
        calls.append(call)
        for entry in pending:
            entry[0] -= 1
        calls.extend(wait for left, wait in pending if left == 0)
        pending = [entry for entry in pending if entry[0] > 0]
    return Program(cpu_program.name, calls)


def report(overlaps: list[Overlap]) -> str:
    lines = []
    for ov in overlaps:
        during = ", ".join(ov.kernels) if ov.kernels else "no CPU kernel"
        lines.append(f"DSP segment {ov.method}: {during} while the DSP works; then wait "
                     f"({ov.stop})")
    return "\n".join(lines)
