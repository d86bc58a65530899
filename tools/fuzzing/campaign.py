"""A fuzz campaign: many seeds in worker processes, a line per finding, a JSON summary, and a
reduced repro script for every failure.

`python -m tools.fuzzing --seeds 0:5000 --jobs 2 --out fuzz-results` runs it (__main__.py);
tests/test_fuzz.py runs a fixed-seed tier of it in CI. A campaign longer than a sitting is
continued with `--resume` (the seeds already in results.jsonl are skipped), from the same
commit only: the figures of a campaign are those of one version of ubitrain.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from .case import Outcome, draw_case, run_case


@dataclass
class Summary:
    seeds: str
    commit: str = ""
    counts: Counter = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # this sitting's; a resumed campaign's earlier ones are not counted

    def line(self) -> str:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        return (f"fuzz {self.seeds} at {self.commit}: {sum(self.counts.values())} models: "
                f"{parts} ({self.seconds:.0f} s)")


def _run_seed(seed: int, precision: str = "fp32") -> dict:
    torch_threads()
    if precision == "int8":
        from .int8_case import draw_int8_case, run_int8_case
        return _record(run_int8_case(draw_int8_case(seed)))
    return _record(run_case(draw_case(seed)))


def _record(o: Outcome) -> dict:
    return dict(seed=o.seed, status=o.status, seconds=round(o.seconds, 2), detail=o.detail)


def torch_threads():
    """One thread per worker: the workers are the parallelism."""
    import torch

    torch.set_num_threads(1)


def run_campaign(seeds: range, jobs: int = 2, out: Path | None = None, reduce: bool = True,
                 progress: bool | None = None, resume: bool = False,
                 precision: str = "fp32") -> Summary:
    """Run every seed; write `out/results.jsonl`, `out/summary.json` and, for each failure,
    `out/repro_<seed>.py` (reduced when `reduce`). `resume`: keep the records of an earlier
    sitting of the same campaign in `out` and run only the seeds they lack. `precision`:
    "int8" draws int8 cases (int8_case.py) instead."""
    summary = Summary(f"{seeds.start}:{seeds.stop}", source_commit())
    start = time.perf_counter()
    done: list[dict] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume:
            done = _earlier_records(out, summary)
        (out / "campaign.json").write_text(json.dumps(
            dict(seeds=summary.seeds, commit=summary.commit, precision=precision)))
    for record in done:
        _count(summary, record)
    todo = [s for s in seeds if s not in {r["seed"] for r in done}]
    log = open(out / "results.jsonl", "a" if resume else "w") if out is not None else None
    ctx = multiprocessing.get_context("spawn")
    try:
        with ctx.Pool(jobs, maxtasksperchild=50) as pool:
            results = pool.imap_unordered(functools.partial(_run_seed, precision=precision),
                                          todo)
            bar = tqdm(results, total=len(todo), desc="fuzz", unit="model",
                       disable=not (progress if progress is not None else _tty()))
            for record in bar:
                if log is not None:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if _count(summary, record):
                    tqdm.write(f"seed {record['seed']}: {record['status']}: "
                               f"{record['detail'].splitlines()[0] if record['detail'] else ''}")
                bar.set_postfix(dict(summary.counts))
    finally:
        if log is not None:
            log.close()
    summary.seconds = time.perf_counter() - start
    if out is not None:
        if reduce:
            from .reduce import write_repro
            for record in summary.failures:
                kept = out / f"repro_{record['seed']}.py"  # reduced in an earlier sitting
                record["repro"] = str(kept if resume and kept.exists()
                                      else write_repro(record["seed"], out))
        (out / "summary.json").write_text(json.dumps(
            dict(asdict(summary), counts=dict(summary.counts)), indent=1))
    return summary


def _count(summary: Summary, record: dict) -> bool:
    """Count a record; whether it is a failure."""
    summary.counts[record["status"]] += 1
    failed = record["status"] in ("mismatch", "internal error")
    if failed:
        summary.failures.append(record)
    return failed


def _earlier_records(out: Path, summary: Summary) -> list[dict]:
    """The records of the campaign in `out`, which must be this one: same seeds, same commit."""
    if not (out / "campaign.json").exists():
        return []
    before = json.loads((out / "campaign.json").read_text())
    if (before["seeds"], before["commit"]) != (summary.seeds, summary.commit):
        raise SystemExit(f"--resume: {out} holds the campaign of seeds {before['seeds']} at "
                         f"{before['commit']}, not seeds {summary.seeds} at {summary.commit}; "
                         "resume it from a checkout of that commit, or use another --out")
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()
            if line.strip()]


def source_commit() -> str:
    """The git commit of the ubitrain source that runs ("+dirty" with uncommitted changes),
    or "unknown" outside a checkout."""
    import ubitrain

    here = Path(ubitrain.__file__).resolve().parent

    def git(*args):
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _tty() -> bool:
    import sys

    return sys.stderr.isatty() and os.environ.get("CI") is None
