"""Rematerialization and paging in the step program: which tensors may leave the arena for a
while, what bringing them back needs, and the rewrite that does it.

A *candidate* is a transient buffer (root slot) with a long gap between two of its uses: it
is accessed last at call `u`, then not again until call `v`. During the gap it may leave the
arena, and come back just before `v` in one of two ways:

* page: `ub_page_out` writes it to storage right after `u`, `ub_page_in` reads it back into a
  new buffer just before `v` (same bytes, so later results are bit-identical);
* recompute: the calls that wrote it are run again just before `v`, on the same inputs
  (the same kernels on the same bytes give the same bits). This *replay* is found by walking
  back from the candidate's writers: an input that still holds, at `v`, the very value the
  original call read is used as it is; any other transient input is rebuilt first by replaying
  its own writers, recursively. An input qualifies as it is when nothing writes it between
  the original read and `v` (so a parameter must not have been updated yet: the early
  optimizer update stays after every use; BatchNorm's running statistics are only written
  by the copies at the end of the step, so a replayed BatchNorm reads the old ones) and it is
  alive at `v`. Builtins are never replayed: a Dropout mask is drawn once per step, so a
  candidate whose value depends on a mask that must be redrawn cannot be recomputed (the
  mask itself may still be paged). When a replay reads another candidate as it is, that
  candidate must be kept over `v`: the solver gets this as a constraint (`deps`). Each
  candidate gets replays of depth 1..MAX_DEPTH: depth d+1 also rebuilds, as temporaries,
  the candidates depth d read as they are (so a chain a → b → c can drop b and c and keep
  only a, as Chen et al.'s segments do), at the price of running b's writers twice.

`rewrite` realises a choice: restored buffers are new root slots (so the arena planner gives
them their own offsets and lifetimes), every later use is redirected to them (views and
in-place chains included), and replays get fresh slots for their temporaries and scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import EXTERNAL_KINDS, PERSISTENT_KINDS, TRANSIENT_KINDS, Call, Program, Slot

CANDIDATE_KINDS = ("activation", "gradient", "mask")
PAGE_OUT, PAGE_IN = "ub_page_out", "ub_page_in"
MAX_DEPTH = 3  # replays rebuild at most this many levels of other candidates


@dataclass(eq=False)
class Replay:
    calls: list[int]  # call indices to run again, in order
    deps: list  # candidates read as they are: they must be kept over `v`
    temp_bytes: int  # temporaries and scratch the replay needs at `v`
    depth: int


@dataclass(eq=False)
class Candidate:
    root: Slot
    u: int  # last call before the gap
    v: int  # first call after it; the buffer is restored just before this call
    nbytes: int
    replays: list[Replay] = field(default_factory=list)  # by depth; empty: cannot recompute

    def replay_for(self, how: str) -> Replay:
        """The replay a choice names: "recompute" is depth 1, "recompute2" depth 2, ..."""
        depth = int(how[len("recompute"):] or 1)
        return self.replays[depth - 1]


def recompute_choice(depth: int) -> str:
    return "recompute" if depth == 1 else f"recompute{depth}"


class _Uses:
    """Call indices at which each root is accessed and written."""

    def __init__(self, program: Program):
        self.calls = program.calls
        self.access: dict[Slot, list[int]] = {}
        self.writes: dict[Slot, list[int]] = {}
        for i, call in enumerate(program.calls):
            for s in call.args + ([call.scratch] if call.scratch else []):
                lst = self.access.setdefault(s.root, [])
                if not lst or lst[-1] != i:
                    lst.append(i)
            for s in call.writes:
                lst = self.writes.setdefault(s.root, [])
                if not lst or lst[-1] != i:
                    lst.append(i)

    def written_between(self, root: Slot, start: int, stop: int) -> bool:
        return any(start <= w < stop for w in self.writes.get(root, []))


def find_candidates(program: Program, min_bytes: int = 0) -> list[Candidate]:
    """Every transient buffer of at least `min_bytes` with a gap of one call or more."""
    uses = _Uses(program)
    out = []
    for root, times in uses.access.items():
        if root.kind not in CANDIDATE_KINDS or root.nbytes < min_bytes or len(times) < 2:
            continue
        u, v = max(zip(times, times[1:]), key=lambda p: p[1] - p[0])
        if v - u >= 2:
            out.append(Candidate(root, u, v, root.nbytes))
    by_root = {c.root: c for c in out}
    for c in out:
        through: set = set()
        for depth in range(1, MAX_DEPTH + 1):
            replay = _find_replay(c, uses, by_root, through, depth)
            if replay is None:
                break
            c.replays.append(replay)
            if not replay.deps:
                break
            through |= {d.root for d in replay.deps}
    return out


class _NoReplay(Exception):
    pass


def _find_replay(cand: Candidate, uses: _Uses, candidates: dict, through: set,
                 depth: int) -> Replay | None:
    """The calls that rebuild `cand` at `v` from values still there (never from the
    candidates in `through`, which are rebuilt too)."""
    v = cand.v
    cutoff: dict[Slot, tuple[int, ...]] = {}  # root -> the writer calls replayed for it
    deps: list[Candidate] = []

    def require(root: Slot, t: int):
        """The value of `root` that call `t` read must be there at `v`."""
        if root.kind == "constant" or root.kind in EXTERNAL_KINDS:
            return
        if root.kind in PERSISTENT_KINDS:
            if uses.written_between(root, t, v):
                raise _NoReplay  # updated (or copied back) before `v`: the old value is gone
            return
        times = uses.access[root]
        if root is not cand.root and root not in through and times[-1] >= v and \
                not uses.written_between(root, t, v):
            dep = candidates.get(root)
            if dep is not None and dep.u < v <= dep.v:
                deps.append(dep)
            return
        writers = tuple(w for w in uses.writes.get(root, []) if w < t)
        if cutoff.setdefault(root, writers) != writers:
            raise _NoReplay  # needed at two different versions
        for w in writers:
            call = uses.calls[w]
            if call.builtin:
                raise _NoReplay  # Dropout masks and other builtins run once per step
            for s in call.reads:
                if s.root is not root:
                    require(s.root, w)

    try:
        require(cand.root, cand.u + 1)
    except _NoReplay:
        return None
    calls = sorted({w for ws in cutoff.values() for w in ws})
    temps = {r for r in cutoff if r is not cand.root}
    for w in calls:
        temps.update(s.root for s in uses.calls[w].writes if s.root is not cand.root)
    scratch = [uses.calls[w].scratch.nbytes for w in calls if uses.calls[w].scratch]
    return Replay(calls, list({id(d): d for d in deps}.values()),
                  sum(r.nbytes for r in temps) + max(scratch, default=0), depth)


def _clone(slot: Slot, roots: dict, cache: dict) -> Slot:
    """`slot` with its root replaced through `roots` (views cloned along the chain)."""
    if slot.root not in roots:
        return slot
    if slot.view_of is None:
        return roots[slot]
    key = id(slot)
    if key not in cache:
        cache[key] = Slot(slot.name + "_r", slot.shape, slot.dtype, slot.kind,
                          view_of=_clone(slot.view_of, roots, cache), offset=slot.offset,
                          label=slot.label, in_place=slot.in_place)
    return cache[key]


def rewrite(program: Program, choices: dict[Candidate, str]) -> tuple[Program, dict]:
    """The program with each chosen candidate paged ("page") or recomputed ("recompute",
    "recompute2", ...: the replay of that depth).

    Returns the new program and {root slot: decision} for the memory plan: the original
    buffer and its restored copy carry the decision, replay temporaries "recompute"."""
    restore_at: dict[int, list[Candidate]] = {}
    out_after: dict[int, list[Candidate]] = {}
    for cand, how in choices.items():
        if how == "keep":
            continue
        restore_at.setdefault(cand.v, []).append(cand)
        if how == "page":
            out_after.setdefault(cand.u, []).append(cand)
    blocks = {c: n for n, c in enumerate(sorted((c for c in choices if choices[c] == "page"),
                                                key=lambda c: (c.u, c.root.name)))}
    roots: dict[Slot, Slot] = {}  # original root -> the copy in use from its restore on
    cache: dict = {}
    decisions: dict[Slot, str] = {}
    calls = program.calls
    new_calls: list[Call] = []
    for i, call in enumerate(calls):
        for cand in restore_at.get(i, []):
            how = choices[cand]
            copy = Slot(f"{cand.root.name}_{'in' if how == 'page' else 're'}",
                        cand.root.shape, cand.root.dtype, cand.root.kind)
            decisions[cand.root] = decisions[copy] = "page" if how == "page" else "recompute"
            if how == "page":
                new_calls.append(Call(PAGE_IN, [copy], [0], builtin=True,
                                      attrs={"block": blocks[cand]}))
            else:
                new_calls.extend(_replay(cand, cand.replay_for(how), calls, copy, roots, cache,
                                         decisions, i))
            roots[cand.root] = copy
        new_calls.append(_remap(call, roots, cache))
        for cand in out_after.get(i, []):
            new_calls.append(Call(PAGE_OUT, [cand.root], [], builtin=True,
                                  attrs={"block": blocks[cand]}))
    rewritten = Program(program.name, new_calls, program.in_place_bytes, program.held)
    return rewritten, decisions


def _remap(call: Call, roots: dict, cache: dict) -> Call:
    args = [_clone(a, roots, cache) for a in call.args]
    if all(a is b for a, b in zip(args, call.args)):
        return call
    return Call(call.kernel, args, list(call.outputs), call.builtin, dict(call.attrs),
                call.scratch)


def _replay(cand: Candidate, replay: Replay, calls: list[Call], copy: Slot, roots: dict,
            cache: dict, decisions: dict, at: int) -> list[Call]:
    local: dict[Slot, Slot] = {}
    local_cache: dict = {}
    replayed = []
    for w in replay.calls:
        call = calls[w]
        for i in call.outputs:  # fresh buffers for everything this replay writes
            root = call.args[i].root
            if root not in local:
                local[root] = copy if root is cand.root else Slot(
                    f"{root.name}_re{at}", root.shape, root.dtype, root.kind)
                decisions[local[root]] = "recompute"
        args = [_clone(a, local, local_cache) if a.root in local else _clone(a, roots, cache)
                for a in call.args]
        scratch = None
        if call.scratch is not None:
            scratch = Slot(f"{call.scratch.name}_re{at}", call.scratch.shape,
                           call.scratch.dtype, call.scratch.kind)
        replayed.append(Call(call.kernel, args, list(call.outputs), False,
                             dict(call.attrs, replay_of=w), scratch))
    return replayed


def check_transient(program: Program) -> None:
    """Every transient buffer is written before it is read (a restore missed otherwise)."""
    written: set = set()
    for call in program.calls:
        for s in call.reads:
            r = s.root
            if r.kind in TRANSIENT_KINDS and r not in written:
                raise AssertionError(f"{r.name} read before written in {call.kernel}")
        written.update(s.root for s in call.writes)
