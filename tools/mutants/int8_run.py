"""Judging an int8 mutant: the int8 (NITI) step compiled once (precision="int8"), each
mutant a rewritten copy of its project, built for the host or a cross target (run under
QEMU), trained beside the numpy reference (fidelity/niti_check.py) and caught if any integer
parameter, loss or predict output differs from it."""

from __future__ import annotations

import copy
import traceback
from pathlib import Path

import ubitrain as ub
from ubitrain.errors import RuntimeStatusError
from ubitrain.fidelity.niti_check import compare_with_reference

from .defects import BASELINE
from .run import MutantResult, rewritten


def compile_int8(model, batches, config, out_dir, target: str = "host"):
    """`model`'s int8 step, as tests/test_int8_graph.py compiles it."""
    x, y = batches[0]
    return ub.compile(copy.deepcopy(model), (x,), y, precision="int8", optimizer=config,
                      target=target, out_dir=Path(out_dir), progress=False)


def compare(pkg, model, batches, config) -> tuple[str, str]:
    """(status, summary): "match" (bit for bit; the summary says how many parameter
    elements moved), "mismatch" (the first differences) or "stops" (a C error status)."""
    trainer = pkg.build()
    try:
        run = compare_with_reference(trainer, copy.deepcopy(model),
                                     [(x.numpy(), y.numpy()) for x, y in batches], config)
    except RuntimeStatusError as err:
        return "stops", str(err)[:400]
    finally:
        close = getattr(trainer, "close", None)
        if close is not None:
            close()
    if run.differences:
        return "mismatch", "; ".join(run.differences[:3])
    return "match", f"{run.moved} parameter elements moved, {run.skipped} reductions skipped"


def judged(mutant, status: str) -> str:
    """A mutant that matches the reference bit for bit, as the C as generated does, computes
    every number the check reads as that C does: "unchanged" (see run.MutantResult)."""
    return "unchanged" if status == "match" and mutant is not BASELINE else status


def judge_int8_mutants(mutants, model, batches, config, out_dir,
                       target: str = "host") -> list[MutantResult]:
    """Every mutant of `mutants` (rewrites of model.c: int8_defects.py, or BASELINE) on
    `model`'s int8 step, compiled once for `target`."""
    out_dir = Path(out_dir)
    pkg = compile_int8(model, batches, config, out_dir / "base", target)
    results = []
    for mutant in mutants:
        where, status, summary = None, "error", ""
        try:
            mutant_pkg, where = rewritten(pkg, mutant, out_dir / mutant.name)
            if where is not None:
                status, summary = compare(mutant_pkg, model, batches, config)
                status = judged(mutant, status)
        except Exception as err:  # noqa: BLE001 - said in the result
            summary = "".join(traceback.format_exception_only(type(err), err)).strip()[:400]
        results.append(MutantResult.of(mutant.name, where, status, summary))
    return results
