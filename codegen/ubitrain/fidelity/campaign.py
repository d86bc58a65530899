"""A fuzz campaign: many seeds in worker processes, a line per finding, a JSON summary, and a
reduced repro script for every failure.

`ubitrain fuzz --seeds 0:5000 --jobs 2 --out fuzz-results` runs it; tests/test_fuzz.py runs a
fixed-seed tier of it in CI. A campaign longer than a sitting is continued with `--resume`
(the seeds already in results.jsonl are skipped), from the same commit only: the figures of a
campaign are those of one version of ubitrain.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from .fuzz import Outcome, draw_case, run_case


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
                 progress: bool | None = None, resume: bool = False) -> Summary:
    """Run every seed; write `out/results.jsonl`, `out/summary.json` and, for each failure,
    `out/repro_<seed>.py` (reduced when `reduce`). `resume`: keep the records of an earlier
    sitting of the same campaign in `out` and run only the seeds they lack."""
    summary = Summary(f"{seeds.start}:{seeds.stop}", source_commit())
    start = time.perf_counter()
    done: list[dict] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if resume:
            done = _earlier_records(out, summary)
        (out / "campaign.json").write_text(json.dumps(
            dict(seeds=summary.seeds, commit=summary.commit)))
    for record in done:
        _count(summary, record)
    todo = [s for s in seeds if s not in {r["seed"] for r in done}]
    log = open(out / "results.jsonl", "a" if resume else "w") if out is not None else None
    ctx = multiprocessing.get_context("spawn")
    try:
        with ctx.Pool(jobs, maxtasksperchild=50) as pool:
            results = pool.imap_unordered(_run_seed, todo)
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
    here = Path(__file__).resolve().parent

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
  ubitrain fuzz --seeds 100000:105000 --out fuzz-results --resume   (continue it later)
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
    f.add_argument("--resume", action="store_true",
                   help="continue the campaign in --out (same seeds, same commit): run only "
                        "the seeds its results.jsonl lacks")


def cmd_fuzz(args) -> int:
    summary = run_campaign(args.seeds, args.jobs, Path(args.out),
                           reduce=not args.no_reduce,
                           progress=False if args.no_progress else None, resume=args.resume)
    for record in summary.failures:
        print(f"seed {record['seed']}: {record['status']}: repro {record.get('repro', '-')}")
    print(summary.line())
    return 1 if summary.failures else 0
