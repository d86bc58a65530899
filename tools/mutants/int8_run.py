"""Judging an int8 mutant: the int8 (NITI) step compiled once (pipeline/int8_graph.py), each
mutant a rewritten copy of its project, built for the host or a cross target (run under
QEMU), trained beside the numpy reference (fidelity/niti_check.py) and caught if any integer
parameter, loss or predict output differs from it."""

from __future__ import annotations

import copy
import traceback
from pathlib import Path

from ubitrain.api import compile_with
from ubitrain.errors import RuntimeStatusError
from ubitrain.fidelity.niti_check import compare_with_reference
from ubitrain.pipeline.int8_graph import INT8_GRAPH

from .defects import BASELINE
from .run import MutantResult, rewritten


def compile_int8(model, batches, config, out_dir, target: str = "host"):
    """`model`'s int8 step through the graph-derived pipeline, as tests/test_int8_graph.py
    compiles it."""
    x, y = batches[0]
    return compile_with(INT8_GRAPH, copy.deepcopy(model), (x,), y, "cross_entropy", config,
                        None, target, None, Path(out_dir), False, None, (), (), None)


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
