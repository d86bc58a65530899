"""Greedy-by-size offset assignment (TensorFlow Lite Micro's GreedyMemoryPlanner): the
baseline ubitrain's arena planner (ubitrain/memory/arena_planner.py) is measured against, in
tests/test_memory_guarantees.py and benchmarks/memory.py; ubitrain itself does not use it.

Buffers are placed largest first. Each goes at the lowest offset where it overlaps no
already placed buffer whose lifetime [first_use, last_use] intersects its own. Placing
large buffers first leaves small ones to fill the gaps. The arena is the highest end
offset. The lower bound of any placement is the largest sum of sizes alive at one moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from ubitrain.memory.arena_planner import align_up


@dataclass
class _Buffer:
    size: int
    first: int
    last: int
    offset: int = -1


class GreedyPlanner:
    def __init__(self, alignment: int = 16):
        self.alignment = alignment
        self.buffers: list[_Buffer] = []
        self._planned = False

    def add_buffer(self, size: int, first_use: int, last_use: int) -> int:
        self.buffers.append(_Buffer(align_up(size, self.alignment), first_use, last_use))
        self._planned = False
        return len(self.buffers) - 1

    def _plan(self):
        if self._planned:
            return
        order = sorted(range(len(self.buffers)),
                       key=lambda i: (-self.buffers[i].size, self.buffers[i].first))
        placed: list[_Buffer] = []
        for i in order:
            b = self.buffers[i]
            live = sorted((p for p in placed if p.first <= b.last and b.first <= p.last),
                          key=lambda p: p.offset)
            offset = 0
            for p in live:
                if offset + b.size <= p.offset:
                    break
                offset = max(offset, p.offset + p.size)
            b.offset = offset
            placed.append(b)
        self._planned = True

    def offset(self, i: int) -> int:
        self._plan()
        return self.buffers[i].offset

    def arena_size(self) -> int:
        self._plan()
        return max((b.offset + b.size for b in self.buffers), default=0)

    def lower_bound(self) -> int:
        events = sorted({b.first for b in self.buffers})
        return max((sum(b.size for b in self.buffers if b.first <= t <= b.last)
                    for t in events), default=0)
