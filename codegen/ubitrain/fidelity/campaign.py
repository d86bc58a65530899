"""A fuzz campaign: many seeds in worker processes, a line per finding, a JSON summary, and a
reduced repro script for every failure.

`ubitrain fuzz --seeds 0:5000 --jobs 2 --out fuzz-results` runs it; tests/test_fuzz.py runs a
fixed-seed tier of it in CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from .fuzz import Outcome, draw_case, run_case


@dataclass
class Summary:
    seeds: str
    counts: Counter = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        return (f"fuzz {self.seeds}: {sum(self.counts.values())} models: {parts} "
                f"({self.seconds:.0f} s)")


def _run_seed(seed: int) -> dict:
    torch_threads()
    outcome = run_case(draw_case(seed))
    return _record(outcome)


def _record(o: Outcome) -> dict:
    return dict(seed=o.seed, status=o.status, seconds=round(o.seconds, 2), detail=o.detail)


def torch_threads():
    """One thread per worker: the workers are the parallelism."""
    import torch

    torch.set_num_threads(1)


def parse_seeds(text: str) -> range:
    """`A:B` (A to B-1) or `N` (0 to N-1)."""
    try:
        a, b = text.split(":", 1) if ":" in text else (0, text)
        seeds = range(int(a), int(b))
    except ValueError:
        raise argparse.ArgumentTypeError(f"give A:B or N, not {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} holds no seed")
    return seeds


def run_campaign(seeds: range, jobs: int = 2, out: Path | None = None, reduce: bool = True,
                 progress: bool | None = None) -> Summary:
    """Run every seed; write `out/results.jsonl`, `out/summary.json` and, for each failure,
    `out/repro_<seed>.py` (reduced when `reduce`)."""
    summary = Summary(f"{seeds.start}:{seeds.stop}")
    start = time.perf_counter()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    log = open(out / "results.jsonl", "w") if out is not None else None
    ctx = multiprocessing.get_context("spawn")
    try:
        with ctx.Pool(jobs, maxtasksperchild=50) as pool:
            results = pool.imap_unordered(_run_seed, seeds)
            bar = tqdm(results, total=len(seeds), desc="fuzz", unit="model",
                       disable=not (progress if progress is not None else _tty()))
            for record in bar:
                summary.counts[record["status"]] += 1
                if log is not None:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if record["status"] in ("mismatch", "internal error"):
                    summary.failures.append(record)
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
                record["repro"] = str(write_repro(record["seed"], out))
        (out / "summary.json").write_text(json.dumps(
            dict(asdict(summary), counts=dict(summary.counts)), indent=1))
    return summary


def _tty() -> bool:
    import sys

    return sys.stderr.isatty() and os.environ.get("CI") is None


FUZZ_HELP = """\
Differential fuzzing: random models built from the supported op table (branches, fan-out,
merges by add/mul/cat, every pool, activation and norm configuration, size-1 and odd dims,
batch 1-16) trained 1-3 steps through the generated C (every rewrite pass on, and again
with a random set of passes off) and in PyTorch, each step judged against PyTorch in
float64. A failure is reduced to a small model and written out as a repro script."""

FUZZ_EPILOG = """\
examples:
  ubitrain fuzz --seeds 0:100                  the seeds CI runs
  ubitrain fuzz --seeds 100000:105000 --out fuzz-results
The last line is the summary: models per outcome (match, mismatch, near kink, unsupported,
internal error). A mismatch or internal error exits with status 1."""


def add_fuzz_parser(sub, formatter):
    f = sub.add_parser("fuzz", help="differential fuzzing against PyTorch on random models",
                       description=FUZZ_HELP, epilog=FUZZ_EPILOG, formatter_class=formatter)
    f.add_argument("--seeds", default=range(100), type=parse_seeds,
                   help="A:B (seeds A to B-1) or N (0 to N-1); default 0:100")
    f.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: one per core)")
    f.add_argument("--out", default="fuzz-results",
                   help="where to write results.jsonl, summary.json and repro scripts")
    f.add_argument("--no-reduce", action="store_true", help="write failures unreduced")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_fuzz(args) -> int:
    summary = run_campaign(args.seeds, args.jobs, Path(args.out),
                           reduce=not args.no_reduce,
                           progress=False if args.no_progress else None)
    for record in summary.failures:
        print(f"seed {record['seed']}: {record['status']}: repro {record.get('repro', '-')}")
    print(summary.line())
    return 1 if summary.failures else 0
