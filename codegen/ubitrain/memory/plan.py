"""The arena of a compiled model: persistent state first, then the step's working memory.

Parameters, buffers, optimizer state and coefficients live across steps, so they sit at
fixed offsets at the start of the arena. `train_step` and `predict` never run at once, so
each plans its transient buffers (activations, gradients, masks, kernel scratch) from the
same base, and the arena is the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..program.ir import PERSISTENT_KINDS, Program, Slot
from .arena_planner import ArenaPlanner, align_up


@dataclass
class PlannedBuffer:
    name: str
    kind: str
    nbytes: int
    offset: int
    lifetime: tuple[int, int] | None  # call indices in its program; None when persistent
    program: str | None
    # "keep" (in the arena for its lifetime), "page" (written to storage after its forward use,
    # read back into a copy before its next use) or "recompute" (rebuilt by running its
    # writers again); the copy and the replay's temporaries carry the same decision.
    decision: str = "keep"
    shared_by: list[str] = field(default_factory=list)  # outputs written over it in place


@dataclass
class MemoryPlan:
    arena_bytes: int
    lower_bound_bytes: int
    persistent_bytes: int
    alignment: int
    buffers: list[PlannedBuffer] = field(default_factory=list)
    offsets: dict = field(default_factory=dict)  # Slot (root) -> offset
    # program -> bytes of outputs that took over a dying input's buffer (no buffer of their own)
    in_place_bytes: dict = field(default_factory=dict)
    strategy: dict = field(default_factory=dict)  # program -> the placement that won
    budget: object | None = None  # memory/budget.py BudgetReport when a budget was given
    micro_batches: int = 1  # the step runs k micro-batches (program/micro_batch.py)

    @property
    def restore_is_atomic(self) -> bool:
        """The generated restore can stage the state in the step's working memory (free
        between steps), so that it changes nothing unless it succeeds. Where that memory is
        smaller than the state, the C restore reads over the state (verified whole first);
        the Python trainer keeps its own copy and is all or nothing either way."""
        return self.arena_bytes - self.persistent_bytes >= self.persistent_bytes

    def bytes_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.buffers:
            out[b.kind] = out.get(b.kind, 0) + b.nbytes
        return out

    def summary(self) -> str:
        ratio = self.arena_bytes / max(self.lower_bound_bytes, 1)
        text = (f"arena {self.arena_bytes:,} B (lower bound {self.lower_bound_bytes:,} B, "
                f"{ratio:.3f}x; persistent state {self.persistent_bytes:,} B)")
        if self.micro_batches > 1:
            text += f"; {self.micro_batches} micro-batches with gradient accumulation"
        b = self.budget
        if b is not None and (b.attempts or b.micro_batches > 1):
            text += (f"; to fit memory_budget {b.budget_bytes:,} B: "
                     f"{b.counts.get('recompute', 0)} recomputed, {b.counts.get('page', 0)} "
                     f"paged, +{b.overhead:.1%} time in the {b.profile} cost model")
        return text


def plan_memory(programs: list[Program], alignment: int = 16,
                decisions: dict | None = None, target: int = 0) -> MemoryPlan:
    """`decisions`: {root slot: "recompute" | "page"} from program/remat.py's rewrite;
    `target`: an arena size that is good enough (a budget), where placement may stop."""
    # here, not at the top: micro_batch.py imports TVM (seconds), which a trainer loading a
    # MemoryPlan from package.json (load_package, a fleet client) does not need
    from ..program.micro_batch import micro_batches_of

    decisions = decisions or {}
    persistent: list[Slot] = []
    seen = set()
    for prog in programs:
        for s in prog.slots():
            r = s.root
            if r.kind in PERSISTENT_KINDS and id(r) not in seen:
                seen.add(id(r))
                persistent.append(r)
    offsets, buffers, base = {}, [], 0
    for s in persistent:
        offsets[s] = base
        buffers.append(PlannedBuffer(s.name, s.kind, s.nbytes, base, None, None))
        base += align_up(s.nbytes, alignment)
    persistent_bytes = base

    transient_peak, lower_bound, strategy = 0, 0, {}
    for prog in programs:
        planner = ArenaPlanner(alignment, target=max(target - base, 0))
        spans = prog.lifetimes()
        ids = {s: planner.add_buffer(s.nbytes, a, b) for s, (a, b) in spans.items()}
        sharers: dict = {}
        for s in prog.slots():
            if s.in_place:
                sharers.setdefault(s.root, []).append(s.name)
        for s, i in ids.items():
            offsets[s] = base + planner.offset(i)
            buffers.append(PlannedBuffer(s.name, s.kind, s.nbytes, offsets[s], spans[s],
                                         prog.name, decision=decisions.get(s, "keep"),
                                         shared_by=sharers.get(s, [])))
        transient_peak = max(transient_peak, planner.arena_size())
        lower_bound = max(lower_bound, planner.lower_bound())
        strategy[prog.name] = planner.strategy
    return MemoryPlan(
        arena_bytes=base + transient_peak,
        lower_bound_bytes=persistent_bytes + lower_bound,
        persistent_bytes=persistent_bytes,
        alignment=alignment,
        buffers=buffers,
        offsets=offsets,
        in_place_bytes={p.name: p.in_place_bytes for p in programs},
        strategy=strategy,
        micro_batches=max((micro_batches_of(p) for p in programs), default=1),
    )
