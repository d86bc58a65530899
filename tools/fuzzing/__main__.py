"""`python -m tools.fuzzing`, from the repository's root: a fuzz campaign (campaign.py) from
the command line. It was `ubitrain fuzz`; the fuzzer is the project's own check, not part
of the package users install, so it runs from a checkout."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

DESCRIPTION = """\
Differential fuzzing: random models built from the supported op table (branches, fan-out,
merges by add/mul/cat, every pool, activation and norm configuration, size-1 and odd dims,
batch 1-16) trained 1-3 steps through the generated C (every rewrite pass on, and again
with a random set of passes off) and in PyTorch, each step judged against PyTorch in
float64. A failure is reduced to a small model and written out as a repro script."""

EPILOG = """\
examples (from the repository's root):
  python -m tools.fuzzing --seeds 0:100                  the seeds CI runs
  python -m tools.fuzzing --seeds 100000:105000 --out fuzz-results
  python -m tools.fuzzing --seeds 100000:105000 --out fuzz-results --resume   (continue it)
  python -m tools.fuzzing --precision int8 --seeds 0:1000 --out fuzz-int8
The last line is the summary: models per outcome (match, mismatch, near kink, unsupported,
internal error). A mismatch or internal error exits with status 1."""


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


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, `error: ...`, and status 2, as the ubitrain command's."""

    def error(self, message):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    f = _Parser(prog="python -m tools.fuzzing", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
                    prog, max_help_position=30))
    f.add_argument("--seeds", default=range(100), type=parse_seeds,
                   help="A:B (seeds A to B-1) or N (0 to N-1); default 0:100")
    f.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: one per core)")
    f.add_argument("--out", default="fuzz-results",
                   help="where to write results.jsonl, summary.json and repro scripts")
    f.add_argument("--precision", choices=["fp32", "int8"], default="fp32",
                   help="int8: random models in the int8 op set, checked bit for bit against "
                        "NITI's numpy reference (int8_case.py); failures are not reduced")
    f.add_argument("--no-reduce", action="store_true", help="write failures unreduced")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument("--resume", action="store_true",
                   help="continue the campaign in --out (same seeds, same commit): run only "
                        "the seeds its results.jsonl lacks")
    return f


def warn_if_another_checkout() -> None:
    """The campaign judges the ubitrain that Python imports, and records its commit: say so
    when that is not this checkout's (e.g. an editable install of another worktree), before
    importing it (another version may not even fit this fuzzer)."""
    from importlib.util import find_spec

    spec = find_spec("ubitrain")
    package = Path(spec.origin).resolve().parent if spec and spec.origin else None
    mine = Path(__file__).resolve().parents[2] / "codegen" / "ubitrain"
    if package != mine:
        print(f"warning: ubitrain is imported from {package}, not from this checkout's "
              f"{mine}: the campaign judges that one (PYTHONPATH=codegen judges this one)",
              file=sys.stderr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    warn_if_another_checkout()
    from ubitrain.errors import UbitrainWarning

    from .campaign import run_campaign

    def show(message, category, *rest, **kw):  # ours as one line; torch's and TVM's: none
        if issubclass(category, UbitrainWarning):
            print(f"warning: {message}", file=sys.stderr)

    for name in ("torch", "tvm"):  # torch.export logs through logging, not warnings
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            summary = run_campaign(args.seeds, args.jobs, Path(args.out),
                                   reduce=not args.no_reduce and args.precision == "fp32",
                                   precision=args.precision,
                                   progress=False if args.no_progress else None,
                                   resume=args.resume)
    except KeyboardInterrupt:  # results.jsonl keeps what finished: --resume continues
        print("interrupted", file=sys.stderr)
        return 130
    for record in summary.failures:
        print(f"seed {record['seed']}: {record['status']}: repro {record.get('repro', '-')}")
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
