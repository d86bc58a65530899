"""The memory plan read back from the emitted C: every buffer's offset, as printed in model.c's
`(A + <offset>u)` pointers, its size and its lifetime over the calls, against the arena size
that model.h declares."""

import re

STATEMENT = re.compile(r"^\s*(UB_TRY\(|memcpy\(|memset\(|ub_dropout_mask\(|\{ "
                       r"|for \(uint32_t ub_mb |\} /\* next micro-batch)")
POINTER = re.compile(r"A \+ (\d+)u")


def _arena_slots(call, line):
    """The slots of one call in the order the emitter prints their pointers. A kernel's
    argument that it reads through another one's pointer is printed as NULL: no pointer."""
    if not call.builtin:
        printed = line[line.index(f"{call.kernel}(") + len(call.kernel) + 1:].split(", ")
        slots = [s for s, text in zip([call.scratch] + list(call.args), printed)
                 if s is not None and not text.startswith("NULL")]
    elif call.kernel == "ub_copy":
        slots = [call.args[1], call.args[0]]
    elif call.kernel == "ub_optimizer_coefficients":
        slots = list(call.args) * len(call.attrs["code"])
    else:
        slots = list(call.args)
    return [s for s in slots if s.root.kind != "constant" and not s.root.external]


def _function_body(source, name):
    start = source.index(f"{name}(")
    start = source.index("{\n", start)
    return source[start:source.index("\n}\n", start)]


def check_emitted_plan(pkg):
    """Every buffer's C offset, size and lifetime: no overlap while alive, all in the arena."""
    source = (pkg.out_dir / "model.c").read_text()
    header = (pkg.out_dir / "model.h").read_text()
    arena = int(re.search(rf"#define UB_{pkg.model_name.upper()}_ARENA_BYTES (\d+)u",
                          header).group(1))
    persistent = {}
    for prog in pkg.programs.values():
        body = _function_body(source, f"ub_{pkg.model_name}_{prog.name}")
        lines = [line for line in body.splitlines() if STATEMENT.match(line)
                 and "ub_check_ctx" not in line]
        assert len(lines) == len(prog.calls), prog.name
        buffers = {}  # root slot -> [offset, bytes, first call, last call]
        for i, (call, line) in enumerate(zip(prog.calls, lines)):
            slots = _arena_slots(call, line)
            offsets = [int(o) for o in POINTER.findall(line)]
            assert len(offsets) == len(slots), line
            for slot, offset in zip(slots, offsets):
                root = slot.root
                entry = buffers.setdefault(root, [offset, root.nbytes, i, i])
                assert entry[0] == offset, f"{root.name} printed at two offsets"
                entry[3] = i
        for root, (offset, nbytes, _, _) in buffers.items():
            assert offset % pkg.memory_plan.alignment == 0
            assert offset + nbytes <= arena, root.name
            if root.persistent:
                assert persistent.setdefault(root, offset) == offset
        live = list(buffers.items())
        for n, (a, (oa, sa, fa, la)) in enumerate(live):
            for b, (ob, sb, fb, lb) in live[n + 1:]:
                together = a.persistent or b.persistent or (fa <= lb and fb <= la)
                if together:
                    assert oa + sa <= ob or ob + sb <= oa, (prog.name, a.name, b.name)
    return arena
