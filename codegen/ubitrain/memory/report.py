"""`ubitrain report`: the arena of one step drawn over time, and a text summary of the plan.

The picture has the step's calls on the x axis and arena addresses on the y axis. Every
buffer is a rectangle from its first to its last use, at its offset, colored by kind;
persistent state (parameters, buffers, optimizer state) is the band at the bottom that spans
the whole step. Buffers that in-place kernels write over are hatched; under a memory budget,
buffers the plan recomputes are cross-hatched and paged ones dotted, with a black edge (the
original buffer ends at its page-out, the copy starts at its page-in or replay). A line
shows the bytes alive at each call, so the gap between it and the top of the rectangles is
what the placement loses to fragmentation. Drawing needs matplotlib, an optional extra
(`pip install 'ubitrain[report]'`); nothing else in ubitrain imports it.
"""

from __future__ import annotations

from pathlib import Path

from .plan import MemoryPlan

KIND_COLORS = {
    "parameter": "#4c72b0", "buffer": "#64b5cd", "optimizer_state": "#8172b2",
    "coefficients": "#937860", "activation": "#dd8452", "gradient": "#55a868",
    "mask": "#da8bc3", "scratch": "#8c8c8c", "accumulator": "#c44e52",
}
DECISION_HATCH = {"recompute": "xxxx", "page": "...."}


def _calls(plan: MemoryPlan, program: str) -> int:
    return max((b.lifetime[1] + 1 for b in plan.buffers if b.program == program), default=1)


def live_bytes(plan: MemoryPlan, program: str) -> list[int]:
    """Bytes alive (persistent state included) before each call of `program`."""
    n = _calls(plan, program)
    live = [plan.persistent_bytes] * n
    for b in plan.buffers:
        if b.program == program:
            size = -(-b.nbytes // plan.alignment) * plan.alignment
            for t in range(b.lifetime[0], b.lifetime[1] + 1):
                live[t] += size
    return live


def require_matplotlib():
    """matplotlib, imported on first use, or a clear error: it is the report extra."""
    from ..errors import UbitrainError

    try:
        import matplotlib
    except ImportError:
        raise UbitrainError("drawing the memory plan needs the report extra: "
                            "pip install 'ubitrain[report]'") from None
    return matplotlib


def render_png(plan: MemoryPlan, path, program: str = "train_step", title: str = "") -> Path:
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    n = _calls(plan, program)
    kib = 1024.0
    fig, ax = plt.subplots(figsize=(12, 6.5), dpi=110)
    plt.rcParams["hatch.color"] = "#00000055"
    plt.rcParams["hatch.linewidth"] = 0.5
    for b in plan.buffers:
        if b.lifetime is None:
            x0, width = 0, n
        elif b.program == program:
            x0, width = b.lifetime[0], b.lifetime[1] - b.lifetime[0] + 1
        else:
            continue
        ax.add_patch(Rectangle((x0, b.offset / kib), width, b.nbytes / kib,
                               facecolor=KIND_COLORS.get(b.kind, "#cccccc"),
                               edgecolor="#000000" if b.decision in DECISION_HATCH
                               else "#ffffff", linewidth=0.3,
                               hatch=DECISION_HATCH.get(b.decision,
                                                        "////" if b.shared_by else None)))
    live = live_bytes(plan, program)
    xs = [x for t in range(n) for x in (t, t + 1)]
    ax.plot(xs, [v / kib for v in live for _ in (0, 1)], color="#1a1a1a", linewidth=0.7,
            label="bytes alive at each call")
    ax.axhline(plan.arena_bytes / kib, color="#c44e52", linestyle="--", linewidth=1.0,
               label=f"arena {plan.arena_bytes / kib:,.1f} KiB")
    ax.axhline(plan.lower_bound_bytes / kib, color="#c44e52", linestyle=":", linewidth=1.0,
               label=f"lower bound {plan.lower_bound_bytes / kib:,.1f} KiB")
    ax.set_xlim(0, n)
    ax.set_ylim(0, plan.arena_bytes / kib * 1.04)
    ax.set_xlabel(f"call of {program} (forward, loss, backward with early updates)")
    ax.set_ylabel("arena offset (KiB)")
    ax.set_title(title or f"{program}: {plan.summary()}", fontsize=10)
    kinds = sorted({b.kind for b in plan.buffers
                    if b.lifetime is None or b.program == program},
                   key=list(KIND_COLORS).index)
    handles = [Patch(facecolor=KIND_COLORS[k], label=k.replace("_", " ")) for k in kinds]
    handles.append(Patch(facecolor="#dddddd", edgecolor="#ffffff", hatch="////",
                         label="written over in place"))
    decided = {b.decision for b in plan.buffers if b.program == program}
    for decision, hatch in DECISION_HATCH.items():
        if decision in decided:
            handles.append(Patch(facecolor="#dddddd", edgecolor="#000000", hatch=hatch,
                                 label={"recompute": "recomputed", "page": "paged"}[decision]))
    line_handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + line_handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def text_summary(plan: MemoryPlan, program: str = "train_step", top: int = 12) -> str:
    lines = [f"memory plan: {plan.summary()}"]
    if plan.budget is not None:
        lines.append(plan.budget.summary())
    mine = [b for b in plan.buffers if b.program == program]
    for decision in DECISION_HATCH:
        chosen = [b for b in mine if b.decision == decision]
        if chosen:
            lines.append(f"{decision}: {len(chosen)} buffers "
                         f"({', '.join(b.name for b in chosen[:8])}"
                         f"{', ...' if len(chosen) > 8 else ''})")
    ratio = plan.arena_bytes / max(plan.lower_bound_bytes, 1)
    lines.append(f"placement: {plan.strategy.get(program, '?')} "
                 f"({ratio:.4f} x lower bound)")
    no_reuse = sum(b.nbytes for b in plan.buffers if b.lifetime is None or
                   b.program == program)
    lines.append(f"all buffers of {program} without reuse: {no_reuse:,} B; "
                 f"outputs written over their input in place: "
                 f"{plan.in_place_bytes.get(program, 0):,} B")
    live = live_bytes(plan, program)
    peak_at = max(range(len(live)), key=live.__getitem__)
    lines.append(f"most bytes alive: {live[peak_at]:,} B at call {peak_at}")
    lines.append("bytes by kind:")
    for kind, nbytes in sorted(plan.bytes_by_kind().items(), key=lambda kv: -kv[1]):
        lines.append(f"  {kind:<16} {nbytes:>12,} B")
    lines.append(f"largest buffers of {program} (name, kind, bytes, offset, lifetime, "
                 "decision):")
    for b in sorted(mine, key=lambda b: -b.nbytes)[:top]:
        shared = f", shared in place by {len(b.shared_by)}" if b.shared_by else ""
        lines.append(f"  {b.name:<28} {b.kind:<12} {b.nbytes:>10,} B  @ {b.offset:>10,}  "
                     f"calls {b.lifetime[0]}-{b.lifetime[1]}  {b.decision}{shared}")
    return "\n".join(lines)
