"""The arena planner: greedy placements from several orders, then a bounded hill-climb.

Every buffer has a size (rounded up to the alignment) and a lifetime [first_use, last_use]
in call order. Two buffers conflict when their lifetimes intersect; a placement gives every
buffer an offset such that conflicting buffers share no byte, and the arena is the highest
end offset. The lower bound is the most bytes alive at one moment: no placement can use
less. Finding the best placement is NP-hard (dynamic storage allocation), so:

1. Placing. Buffers are placed one at a time in a given order. Each goes into a gap between
   the already placed buffers it conflicts with: the lowest gap that fits ("first fit",
   TensorFlow Lite Micro's rule) or the smallest gap that fits ("best fit"); with no fitting
   gap, on top of them.
2. Seed orders. Largest first (TFLM's greedy by size); most conflicting bytes first (TVM
   USMP's greedy by conflicts); largest size × lifetime first; longest lifetime first; and
   first use order (Melon's observation that training allocates and frees in a stack-like
   pattern). Each order is placed with both fit rules and the best result is kept.
3. Hill-climb. While the arena is above the lower bound, for a bounded number of steps:
   One step takes a buffer that ends at the top of the arena (the one the arena's size
   depends on), or half the time one of the buffers it conflicts with, moves it to a random
   position of the order and places the order again; the change is kept when the arena does
   not grow (sideways moves let it cross plateaus). A few climbs restart from the best seed
   placement with different random streams, and the best result is kept. Seeded generators
   keep the plan the same from one compile to the next; the work is bounded (steps and
   conflict pairs visited), and it stops as soon as the arena equals the lower bound (or,
   given a `target` such as a memory budget's share, once the arena is at most that).

The interface is TFLM's: `add_buffer(size, first_use, last_use)`, `offset(i)`,
`arena_size()`, plus `lower_bound()`.
"""

from __future__ import annotations

import random

import numpy as np

HILL_CLIMB_STEPS = 2000  # placements tried at most after the seed orders,
HILL_CLIMB_WORK = 8_000_000  # at most this many (placements × conflict pairs) units of work,
HILL_CLIMB_RESTARTS = 4  # split over this many climbs from the best seed placement


def align_up(n: int, alignment: int) -> int:
    """`n` rounded up to a multiple of `alignment`: every buffer's size, so every offset."""
    return (n + alignment - 1) // alignment * alignment


class ArenaPlanner:
    def __init__(self, alignment: int = 16, seed: int = 0, target: int = 0):
        self.alignment = alignment
        self.seed = seed
        self.target = target  # good enough: stop improving at this arena
        self.sizes: list[int] = []
        self.spans: list[tuple[int, int]] = []
        self._offsets: list[int] | None = None
        self._arena = 0
        self.strategy = ""  # which order and fit rule produced the plan

    def add_buffer(self, size: int, first_use: int, last_use: int) -> int:
        self.sizes.append(align_up(size, self.alignment))
        self.spans.append((first_use, last_use))
        self._offsets = None
        return len(self.sizes) - 1

    def offset(self, i: int) -> int:
        self._plan()
        return self._offsets[i]

    def arena_size(self) -> int:
        self._plan()
        return self._arena

    def lower_bound(self) -> int:
        events = sorted({a for a, _ in self.spans})
        return max((sum(s for s, (a, b) in zip(self.sizes, self.spans) if a <= t <= b)
                    for t in events), default=0)

    # ---- planning ------------------------------------------------------------------------
    def _conflicts(self) -> list[np.ndarray]:
        n = len(self.sizes)
        by_first = sorted(range(n), key=lambda i: self.spans[i][0])
        out: list[list[int]] = [[] for _ in range(n)]
        for x, i in enumerate(by_first):
            last_i = self.spans[i][1]
            for j in by_first[x + 1:]:
                if self.spans[j][0] > last_i:
                    break
                out[i].append(j)
                out[j].append(i)
        return [np.asarray(c, np.int64) for c in out]  # indexes offsets in _gap

    def _place(self, order, conflicts, best_fit: bool, start: int = 0,
               known: list[int] | None = None) -> tuple[list[int], int]:
        """Offsets and arena of placing `order`; `known`: the offsets of an order whose first
        `start` buffers are these, which are placed where they were (a buffer's place depends
        only on those before it)."""
        sizes = np.asarray(self.sizes, np.int64)
        offsets = np.full(len(sizes), -1, np.int64)
        arena = 0
        for i in order[:start]:
            offsets[i] = known[i]
            arena = max(arena, known[i] + self.sizes[i])
        for i in order[start:]:
            chosen = _gap(offsets, sizes, conflicts[i], self.sizes[i], best_fit)
            offsets[i] = chosen
            arena = max(arena, chosen + self.sizes[i])
        return offsets.tolist(), arena

    def _seed_orders(self, conflicts) -> dict[str, list[int]]:
        n = range(len(self.sizes))
        size, span = self.sizes, self.spans
        length = [b - a + 1 for a, b in span]
        conflict_bytes = [sum(size[j] for j in conflicts[i]) for i in n]
        return {
            "greedy_by_size": sorted(n, key=lambda i: (-size[i], span[i][0])),
            "greedy_by_conflicts": sorted(n, key=lambda i: (-conflict_bytes[i] - size[i],
                                                            -size[i])),
            "greedy_by_area": sorted(n, key=lambda i: (-size[i] * length[i], -size[i])),
            "greedy_by_lifetime": sorted(n, key=lambda i: (-length[i], -size[i])),
            "first_use": sorted(n, key=lambda i: (span[i][0], -length[i])),
        }

    def _plan(self):
        if self._offsets is not None:
            return
        if not self.sizes:
            self._offsets, self._arena = [], 0
            return
        conflicts = self._conflicts()
        bound = max(self.lower_bound(), self.target)
        best = None
        for name, order in self._seed_orders(conflicts).items():
            for best_fit in (False, True):
                offsets, arena = self._place(order, conflicts, best_fit)
                if best is None or arena < best[0]:
                    best = (arena, order, best_fit, offsets,
                            f"{name}, {'best' if best_fit else 'first'} fit")
        arena, order, best_fit, offsets, strategy = best
        work = sum(len(c) for c in conflicts) + len(order)
        steps = min(HILL_CLIMB_STEPS, HILL_CLIMB_WORK // max(work, 1)) // HILL_CLIMB_RESTARTS
        for restart in range(HILL_CLIMB_RESTARTS):
            if arena <= bound:
                break
            rng = random.Random(self.seed * HILL_CLIMB_RESTARTS + restart)
            c_order, c_offsets, c_arena = self._climb(best[1], best[3], best[0], conflicts,
                                                      best_fit, bound, steps, rng)
            if c_arena < arena:
                order, offsets, arena = c_order, c_offsets, c_arena
                strategy = f"{best[4]}, hill-climbed (restart {restart + 1})"
        self.strategy = strategy
        self._offsets, self._arena = offsets, arena

    def _climb(self, order, offsets, arena, conflicts, best_fit, bound, steps, rng):
        for _ in range(steps):
            if arena <= bound:
                break
            top = [i for i in order if offsets[i] + self.sizes[i] == arena]
            i = rng.choice(top)
            if rng.random() < 0.5 and len(conflicts[i]):
                i = int(rng.choice(conflicts[i]))  # or one of the buffers it sits on
            to, at = rng.randrange(len(order)), order.index(i)
            candidate = list(order)
            candidate.insert(to, candidate.pop(at))  # the buffers before both keep their place
            cand_offsets, cand_arena = self._place(candidate, conflicts, best_fit,
                                                   min(to, at), offsets)
            if cand_arena <= arena:
                order, offsets, arena = candidate, cand_offsets, cand_arena
        return order, offsets, arena


def _gap(offsets, sizes, conflicting, size: int, best_fit: bool) -> int:
    """The offset for a buffer of `size` among the placed buffers (offset >= 0) of
    `conflicting`: scanned in (offset, size) order, the lowest gap between them that fits
    (first fit) or the first of the smallest (best fit); with none, on top of them all."""
    placed = offsets[conflicting]
    keep = placed >= 0
    starts, lengths = placed[keep], sizes[conflicting][keep]
    if not starts.size:
        return 0
    by_offset = np.lexsort((lengths, starts))
    starts = starts[by_offset]
    tops = np.maximum.accumulate(starts + lengths[by_offset])
    cursors = np.concatenate(([0], tops[:-1]))  # the highest end below each buffer, in order
    gaps = starts - cursors
    fits = gaps >= size
    if not fits.any():
        return int(tops[-1])
    first = int(np.argmin(np.where(fits, gaps, np.iinfo(np.int64).max))) if best_fit \
        else int(np.argmax(fits))
    return int(cursors[first])
